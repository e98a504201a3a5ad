// query.hpp — the `meshsim query` engine: JSON Lines in, one answer line per request line.
//
// Request: {"op": "...", "id"?: any, "convention"?: "torch" | "cute", ...op arguments}.
// Answer:  {"id": ..., "ok": true, "result": ...} or
//          {"id": ..., "ok": false, "error": {"type": "<ErrorClass>", "message": "..."}}.
// A malformed line gets an error answer; processing continues. Answers keep input order.
//
//   std::string a = meshsim::query::answer_line(R"({"op":"size","layout":"(2,4):(4,1)"})");
//   // {"id":null,"ok":true,"result":8}
//
// Thread safety: every function is safe from any thread; nothing is process-wide (each call's
// answer budget is its argument).
#pragma once

#include <cstddef>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshsim/mesh_program.hpp"

namespace meshsim::query {

// answer_line answers one request line (without the trailing newline). A plain request (ASCII
// without escapes, integer numbers, an integer or plain string id) is read by a fast reader
// (json_tape.hpp, RapidJSON underneath); any other line, and any request that fails, is read
// again by nlohmann::json, which words every error. Both run the same handlers, so the answer is
// the same either way: answer_line_nlohmann is that second reader alone, for tests and benchmarks.
// max_elements is the element budget of the answer (kDefaultMaxAnswerElements, mesh_program.hpp;
// a budget < 1 is answered InvalidArgument).
std::string answer_line(std::string_view line, int64_t max_elements = kDefaultMaxAnswerElements);
std::string answer_line_nlohmann(std::string_view line, int64_t max_elements = kDefaultMaxAnswerElements);
// ops lists the supported op names, sorted.
std::vector<std::string> ops();
// run answers every line of `in` on `out`, one line each, flushing per answer when `flush`;
// blank lines are skipped. Returns the number of answers written. Without `flush`, answers are
// still flushed before any read that may wait for input, so a caller that sends a request and
// waits for its answer gets it; `flush` adds a flush after every answer.
std::size_t run(std::istream& in, std::ostream& out, bool flush = false,
                int64_t max_elements = kDefaultMaxAnswerElements);

// kMaxLineBytes bounds one request line; a longer line gets a ResourceExhausted answer and ends
// the input (its end cannot be found within bounded memory).
inline constexpr std::size_t kMaxLineBytes = std::size_t{64} << 20;

// RunResult is what run_lines did: answers written, and whether the input was read to its end
// (false after a read error or an over-long line; the tool then exits non-zero).
struct RunResult {
  std::size_t answers = 0;
  bool input_ok = true;
};
RunResult run_lines(std::istream& in, std::ostream& out, bool flush = false,
                    int64_t max_elements = kDefaultMaxAnswerElements);

namespace detail {
// fast_answer is answer_line's fast reader alone: the answer (an op's refusal included), or
// nullopt when the line is left to nlohmann (outside the fast reader's subset, an unknown op, or
// a request whose arguments fail to read).
std::optional<std::string> fast_answer(std::string_view line, int64_t max_elements = kDefaultMaxAnswerElements);
}  // namespace detail

}  // namespace meshsim::query
