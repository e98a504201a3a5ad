#include "meshsim/cli_common.hpp"

namespace meshsim::cli {

bool job_failed(const Error& e) {
  return dynamic_cast<const Unavailable*>(&e) != nullptr || dynamic_cast<const DeadlineExceeded*>(&e) != nullptr ||
         dynamic_cast<const AlreadyExists*>(&e) != nullptr;
}

}  // namespace meshsim::cli
