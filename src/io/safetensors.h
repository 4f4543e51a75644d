// safetensors: Hugging Face's weight format. A file is an 8-byte little-endian header length N, N
// bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data region; offsets are relative to the data region's start.
//
// A model folder holds either one model.safetensors or several shards listed by
// model.safetensors.index.json ({"weight_map": {tensor name: shard file name}}). Every shard is
// memory-mapped; tensors point into the mappings. Everything in a header is validated before a
// pointer is handed out, so a corrupt or truncated file gives a one-line error naming the file and
// tensor, never an out-of-bounds read.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/weights.h"

namespace pagellm {

// The parsed header of one safetensors file. TensorInfo::data points into the given buffer.
struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // in file order (sorted by data offset)
  int64_t data_offset = 0;          // byte offset of the data region in the file
};

// Parses and validates a whole safetensors file held in memory (`file` names it in messages).
// Checks: header length against the size, JSON syntax, header shape, duplicate names, dtypes,
// shape * dtype size == end - begin, offsets inside the data region, no two tensors overlapping.
Result<SafetensorsHeader> parse_safetensors(const uint8_t* data, int64_t size,
                                            const std::string& file);

// Opens DIR/model.safetensors.index.json and its shards, or DIR/model.safetensors.
Result<std::unique_ptr<WeightSource>> open_safetensors_weights(const std::string& model_dir);

// Opens a single safetensors file (any name) as a weight source.
Result<std::unique_ptr<WeightSource>> open_safetensors_file(const std::string& path);

}  // namespace pagellm
