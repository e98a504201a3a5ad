// dump_reader.hpp — Flight Recorder dumps read from bytes (a pickle through pickle.hpp's bounded
// reader, or the same fields as JSON) and from a directory of `<prefix><rank>` files, bounded.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshsim/fr_schema.hpp"

namespace meshsim::trace {

struct DumpLimits {
  std::size_t max_file_bytes = std::size_t{1} << 30;
  std::size_t max_files = std::size_t{1} << 20;
  std::size_t max_entries = std::size_t{1} << 22;  // per dump
  std::size_t max_group_ranks = std::size_t{1} << 22;
  // What a dump decodes to (sizes, dtypes, names, rank lists: 8 bytes a number, a string's
  // length and 32 more, 24 a list) is at most this many bytes per input byte, plus the floor.
  // Memo references let a small pickle name one big list many times; Python shares it, the
  // decoded records would copy it, so past this bound the dump is refused (ResourceExhausted).
  std::size_t decoded_bytes_per_input_byte = 32;
  std::size_t decoded_bytes_floor = std::size_t{64} << 20;
};

// parse_dump reads one dump's bytes (a pickle when they start with the PROTO opcode 0x80, else
// JSON). `path` names it in errors.
Dump parse_dump(std::string_view bytes, int64_t rank, const std::string& path, const DumpLimits& limits = {});

struct DumpSet {
  std::string dir, prefix;
  std::vector<Dump> dumps;  // by rank
};

// read_dump_dir reads every `<prefix><rank>` file in `dir` and below (an optional ".json",
// ".pkl" or ".pickle" after the rank). Without a prefix, the one prefix that every file named
// `<letters><digits>` shares is used, as fr_trace infers it; more than one is an error asking
// for --prefix. Two files of one rank, an unreadable file or none at all are InvalidArgument.
// The files are read and decoded on `workers` threads (0: one per core); the dumps, and the
// error when one fails (the first in file order), are the same for any number.
DumpSet read_dump_dir(const std::string& dir, const std::optional<std::string>& prefix, const DumpLimits& limits = {},
                      unsigned workers = 0);

}  // namespace meshsim::trace
