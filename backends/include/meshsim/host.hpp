// meshsim/host.hpp — this process on its host, as the store and the launchers name it: the
// host's name, whether a pid of this host is alive, a host name as the address the store uses.
#pragma once

#include <string>

namespace meshsim::host {

// this_host is gethostname() ("?" if it fails).
std::string this_host();

// process_alive says whether /proc/<pid> is a live (not zombie) process of this host.
bool process_alive(const std::string& pid);

// numeric_address is `name` resolved to an IP address (IPv4 first), as meshsim's store binds
// and connects; Unavailable naming the host when it cannot be resolved.
std::string numeric_address(const std::string& name);

}  // namespace meshsim::host
