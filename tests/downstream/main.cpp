#include <meshsim/algebra.hpp>
#include <meshsim/error.hpp>

int main() {
  meshsim::Layout r = meshsim::complement(meshsim::parse_layout("(2,2):(4,1)"), 16);
  if (r != meshsim::parse_layout("(2,2):(8,2)")) return 1;
  try {
    meshsim::parse_layout("(2,2):(1)");
    return 2;
  } catch (const meshsim::InvalidArgument&) {
  }
  return 0;
}
