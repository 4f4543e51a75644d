#include "tools/commands.h"

namespace pagellm::cli {

int run_inspect(int argc, char** argv);
int run_generate(int argc, char** argv);
int run_serve(int argc, char** argv);
int run_chat(int argc, char** argv);
int run_bench(int argc, char** argv);
int run_tokenize(int argc, char** argv);
int run_detokenize(int argc, char** argv);
int run_template(int argc, char** argv);
int run_quantize(int argc, char** argv);

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"serve", "OpenAI-compatible HTTP server (--model DIR --host --port ...; docs/API.md)",
       run_serve},
      {"generate", "generate tokens from a prompt (--model DIR --prompt-ids ... | \"text\")",
       run_generate},
      {"bench", "benchmarks: latency (batch 1) | throughput (offline) | serve (online load) | cost",
       run_bench},
      {"chat", "interactive chat on the terminal with the model's chat template", run_chat},
      {"inspect", "print a checkpoint's parsed config, parameter count and bytes", run_inspect},
      {"quantize", "a float Hugging Face checkpoint to an AWQ or FP8 one (--model DIR --out DIR)",
       run_quantize},
      {"tokenize", "text to token ids, one JSON string per line (--model DIR --jsonl FILE)",
       run_tokenize},
      {"detokenize", "token ids to text, one JSON id array per line (--model DIR --jsonl FILE)",
       run_detokenize},
      {"template",
       "render the chat template (--model DIR|FILE.gguf --messages FILE.json "
       "[--add-generation-prompt])",
       run_template},
  };
  return kCommands;
}

}  // namespace pagellm::cli
