#include "meshsim/host.hpp"

#include "rank_registry.hpp"
#include "socket.hpp"

namespace meshsim::host {

std::string this_host() { return detail::this_host(); }
bool process_alive(const std::string& pid) { return detail::process_alive(pid); }
std::string numeric_address(const std::string& name) { return detail::numeric_host(name); }

}  // namespace meshsim::host
