# meshsim_discover_spmd_tests(<target> [LABELS <label>...] [DISCOVERY_TIMEOUT <s>])
#
# Registers the MESHSIM_SPMD_TEST instances of <target> with ctest, one gtest_discover_tests
# call per backend, so each backend's instances (Suite.Name/<backend>) carry the backend's name
# as a ctest label (`ctest -L threaded`) besides any LABELS given. Tests of <target> that are not
# SPMD instances are not registered here; discover them with a filter of your own.
include_guard(GLOBAL)
include(GoogleTest)

set(MESHSIM_SPMD_BACKENDS threaded gloo fiber)
if(MESHSIM_WITH_NCCL OR meshsim_WITH_NCCL)
  list(APPEND MESHSIM_SPMD_BACKENDS nccl)
endif()

function(meshsim_discover_spmd_tests target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "DISCOVERY_TIMEOUT" "LABELS")
  if(NOT arg_DISCOVERY_TIMEOUT)
    set(arg_DISCOVERY_TIMEOUT 30)
  endif()
  foreach(backend IN LISTS MESHSIM_SPMD_BACKENDS)
    gtest_discover_tests(${target} TEST_FILTER "*/${backend}"
                         DISCOVERY_TIMEOUT ${arg_DISCOVERY_TIMEOUT}
                         PROPERTIES LABELS "${backend};${arg_LABELS}")
  endforeach()
endfunction()
