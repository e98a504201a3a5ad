// meshsim/error.hpp — the one exception hierarchy of meshsim.
//
// Every precondition violation in meshsim is reported by throwing a subclass of meshsim::Error
// whose message names the offending value and the rule it broke, for example
//   composition: shape 4 of B does not divide mode 3 of A in (3,4):(1,5)
// The subclasses follow a small canonical taxonomy (as in absl::StatusCode):
//
// Which class for which condition (one rule per condition, used the same way everywhere):
//   - the input itself is malformed or breaks an operation's rule, whatever the state
//     (bad shape, non-congruent stride, sizes that do not divide, duplicate names): InvalidArgument;
//     text or JSON that does not parse: ParseError;
//   - an index, a dim, a rank or a count outside its range: OutOfRange; a product that does
//     not fit in int64: OverflowError;
//   - a valid request the object cannot honour in its state (slice, flatten or unflatten of
//     a mesh without mesh_dim_names, by name or by index; a rank not in the mesh): FailedPrecondition;
//   - a name looked up and absent (a dim name, a handle, an op): NotFound; registered twice with
//     a different meaning: AlreadyExists;
//   - an answer or a request over a size limit (the element budget, the line limit): ResourceExhausted;
//   - waits: DeadlineExceeded (this wait ran out), Aborted (another participant failed first),
//     Unavailable (a stream, peer or store cannot be reached); Internal only for meshsim's bugs.
//
//   try { auto r = meshsim::composition(a, b); }
//   catch (const meshsim::InvalidArgument& e) { /* the input broke a rule */ }
//   catch (const meshsim::Error& e) { /* anything else meshsim reports */ }
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace meshsim {

// Error is the base of every exception meshsim throws on purpose. type_name() is the stable
// class name reported by tools (e.g. the "type" field of a `meshsim query` error answer).
class Error : public std::runtime_error {
 public:
  // A NUL byte in the message (a user's value quoted whole) is written as \x00: what() is a C
  // string, and every reader of it (the tool's stderr, Python's exception) would stop there.
  explicit Error(const std::string& message) : std::runtime_error(without_nul(message)) {}
  virtual const char* type_name() const noexcept { return "Error"; }

 private:
  static std::string without_nul(const std::string& m) {
    if (m.find('\0') == std::string::npos) return m;
    std::string out;
    out.reserve(m.size() + 8);
    for (char c : m) {
      if (c == '\0') {
        out += "\\x00";
      } else {
        out += c;
      }
    }
    return out;
  }
};

#define MESHSIM_DEFINE_ERROR(Name, Base)                                 \
  class Name : public Base {                                             \
   public:                                                               \
    explicit Name(const std::string& message) : Base(message) {}         \
    const char* type_name() const noexcept override { return #Name; }    \
  }

// InvalidArgument: the input breaks a rule regardless of state (bad shape, non-congruent
// stride, divisibility condition of composition, non-injective layout in complement).
MESHSIM_DEFINE_ERROR(InvalidArgument, Error);
// ParseError: text or JSON that is not well formed.
MESHSIM_DEFINE_ERROR(ParseError, InvalidArgument);
// OutOfRange: an index or value outside its valid range ("index 3 is out of range [-2, 2)").
MESHSIM_DEFINE_ERROR(OutOfRange, Error);
// OverflowError: a size, cosize or index product does not fit in 64-bit signed arithmetic.
MESHSIM_DEFINE_ERROR(OverflowError, OutOfRange);
// FailedPrecondition: the operation is valid in general but not in this state.
MESHSIM_DEFINE_ERROR(FailedPrecondition, Error);
// NotFound / AlreadyExists: lookups and registrations by name.
MESHSIM_DEFINE_ERROR(NotFound, Error);
MESHSIM_DEFINE_ERROR(AlreadyExists, Error);
// ResourceExhausted: the answer would be too large to produce (an enumeration of 2^40 ranks).
MESHSIM_DEFINE_ERROR(ResourceExhausted, Error);
// DeadlineExceeded: a wait ran past its deadline.
MESHSIM_DEFINE_ERROR(DeadlineExceeded, Error);
// Aborted: the operation stopped because another participant failed (a rank of the same run
// threw, departed or was diagnosed); the message names that participant.
MESHSIM_DEFINE_ERROR(Aborted, Error);
// Unavailable: a resource (a stream, a peer, a store) could not be read or reached.
MESHSIM_DEFINE_ERROR(Unavailable, Error);
// Internal: a broken invariant inside meshsim; always a bug.
MESHSIM_DEFINE_ERROR(Internal, Error);

#undef MESHSIM_DEFINE_ERROR

// kQuotedLimit bounds how much of one value an error message quotes.
inline constexpr std::size_t kQuotedLimit = 200;

// quote_input is a value the user wrote as an error message shows it: in single quotes, whole when
// it is at most kQuotedLimit bytes; longer, the kQuotedLimit bytes around offset `at` (from the
// start by default), "..." where bytes are left out, and the whole length, so a 64 MiB request
// line never comes back as a 64 MiB message. Cuts fall between UTF-8 characters.
//   quote_input("tp") == "'tp'";  quote_input(std::string(300, 'a')) == "'aaa...a...' (300 bytes)"
std::string quote_input(std::string_view text, std::size_t at = 0);

}  // namespace meshsim
