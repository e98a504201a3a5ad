// meshsim/decimal.hpp — the house's one decimal integer reader, under every reader of a number
// in text: flags, job files, environment variables, store values, dump names and records.
//
//   read_decimal("42") == 42;  read_decimal("-7") == -7;  read_decimal("+7") == nullopt
//   read_decimal("4 2"), read_decimal(""), read_decimal("0x10") == nullopt
//   bool over = false; read_decimal("9223372036854775808", &over) == nullopt, over == true
//
// Thread safety: pure function.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace meshsim {

// read_decimal reads the whole of `text` as a decimal int64: an optional '-' then digits, nothing
// else (no '+', no space). nullopt when it is not one; `overflow`, when given, says whether the
// text was digits that do not fit in int64 (set either way).
std::optional<int64_t> read_decimal(std::string_view text, bool* overflow = nullptr);

}  // namespace meshsim
