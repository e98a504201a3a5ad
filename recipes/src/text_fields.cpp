#include "meshsim/text_fields.hpp"

#include <cctype>
#include <sstream>

#include "meshsim/error.hpp"

namespace meshsim::text {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

int64_t parse_int(const std::string& s, const std::string& what) {
  std::size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::out_of_range&) {
    throw OverflowError(what + ": " + quote_input(s) + " does not fit in a 64-bit signed integer");
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || std::isspace(static_cast<unsigned char>(s[0]))) {
    throw InvalidArgument(what + ": " + quote_input(s) + " is not an integer");
  }
  return v;
}

}  // namespace meshsim::text
