#include "runtime/step_batch.h"

#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace pagellm {
namespace {

std::vector<int32_t> read(const Tensor& t) {
  const int32_t* p = t.ptr<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

// The layout recorded decode graphs rely on: real sequences first, then padding sequences with
// one token 0 each, slot -1, no context and an empty block table row; block tables as wide as
// asked; attention planned for the given bound.
TEST(StepBatchTest, PaddedDecodeBatchLayout) {
  auto backend = make_cpu_backend();
  StepBatchBuilder builder(*backend, /*block_size=*/4);
  const std::vector<int32_t> tok_a = {7}, tok_b = {9};
  const std::vector<int32_t> table_a = {3, 5}, table_b = {1};
  std::vector<SeqChunk> seqs(2);
  seqs[0] = {tok_a.data(), 1, /*start_pos=*/5, table_a.data(), 2, LogitsWanted::kLast};
  seqs[1] = {tok_b.data(), 1, /*start_pos=*/0, table_b.data(), 1, LogitsWanted::kLast};
  const StepBatch& b = builder.build_padded(seqs, /*n_seqs=*/4, /*table_width=*/3, /*max_context=*/12);
  EXPECT_EQ(b.n_tokens, 4);
  EXPECT_EQ(b.n_logits, 4);
  EXPECT_EQ(read(b.token_ids), (std::vector<int32_t>{7, 9, 0, 0}));
  // Token at position 5 of sequence a: block 5 / 4 = 1 -> physical 5, offset 1.
  EXPECT_EQ(read(b.slot_mapping), (std::vector<int32_t>{5 * 4 + 1, 1 * 4 + 0, -1, -1}));
  EXPECT_EQ(read(b.attn.cu_seqlens_q), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(read(b.attn.seq_lens_kv), (std::vector<int32_t>{6, 1, 0, 0}));
  ASSERT_EQ(b.attn.block_tables.size(1), 3);
  EXPECT_EQ(read(b.attn.block_tables), (std::vector<int32_t>{3, 5, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(read(b.logits_rows), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(b.attn.n_seqs, 4);
  EXPECT_EQ(b.attn.max_seqlen_q, 1);
  EXPECT_EQ(b.attn.max_seqlen_kv, 12);
  EXPECT_EQ(b.positions, (std::vector<int32_t>{5, 0, 0, 0}));
  EXPECT_TRUE(b.logits_every_token);
}

// Whether the LM head may read the hidden rows as they are: only where the logits rows are every
// token in order (decode steps, or one chunk that wants every row).
TEST(StepBatchTest, LogitsOfEveryTokenInOrder) {
  auto backend = make_cpu_backend();
  StepBatchBuilder builder(*backend, 16);
  const std::vector<int32_t> one = {7}, three = {1, 2, 3}, table = {0};
  const SeqChunk decode{one.data(), 1, 4, table.data(), 1, LogitsWanted::kLast};
  const SeqChunk prompt_end{three.data(), 3, 0, table.data(), 1, LogitsWanted::kLast};
  const SeqChunk prompt_mid{three.data(), 3, 0, table.data(), 1, LogitsWanted::kNone};
  const SeqChunk prompt_all{three.data(), 3, 0, table.data(), 1, LogitsWanted::kAll};
  EXPECT_TRUE(builder.build({decode, decode}).logits_every_token);
  EXPECT_TRUE(builder.build({prompt_all}).logits_every_token);
  EXPECT_TRUE(builder.build({prompt_all, decode}).logits_every_token);
  const StepBatch& last = builder.build({prompt_end});
  EXPECT_FALSE(last.logits_every_token);
  EXPECT_EQ(read(last.logits_rows), (std::vector<int32_t>{2}));
  EXPECT_FALSE(builder.build({decode, prompt_end}).logits_every_token);
  EXPECT_FALSE(builder.build({prompt_mid, decode}).logits_every_token);
  EXPECT_FALSE(builder.build({decode, prompt_mid}).logits_every_token);
}

// Addresses stay put once the largest batch has been built: the premise of replaying graphs.
TEST(StepBatchTest, PaddedLayoutAddressesAreStableAfterTheLargestBuild) {
  auto backend = make_cpu_backend();
  StepBatchBuilder builder(*backend, 16);
  builder.build_padded({}, 8, 4, 64);
  const std::vector<int32_t> tok = {1}, table = {0};
  std::vector<SeqChunk> one = {{tok.data(), 1, 3, table.data(), 1, LogitsWanted::kLast}};
  const void* ids = builder.build_padded(one, 2, 4, 64).token_ids.data;
  builder.build_padded({}, 8, 4, 64);
  EXPECT_EQ(builder.build_padded(one, 2, 4, 64).token_ids.data, ids);
}

TEST(StepBatchTest, PaddedBatchRefusesPrefillChunks) {
  auto backend = make_cpu_backend();
  StepBatchBuilder builder(*backend, 16);
  const std::vector<int32_t> toks = {1, 2}, table = {0};
  std::vector<SeqChunk> prefill = {{toks.data(), 2, 0, table.data(), 1, LogitsWanted::kLast}};
  EXPECT_DEATH(builder.build_padded(prefill, 2, 4, 64), "decode steps only");
}

}  // namespace
}  // namespace pagellm
