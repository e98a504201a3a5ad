# Installs the build tree into a scratch prefix, then configures, builds and runs a downstream
# project that uses find_package(meshsim), and runs the installed `meshsim` tool.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${MESHSIM_BUILD_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "cmake --install failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${DOWNSTREAM_SOURCE} -B ${WORK_DIR}/build -G ${GENERATOR}
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the downstream project failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the downstream project failed: ${rc}")
endif()
execute_process(COMMAND ${WORK_DIR}/build/downstream RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "the downstream program failed: ${rc}")
endif()
# The downstream suite, through ctest: the SPMD instance carries the backend's label.
execute_process(COMMAND ${CMAKE_CTEST_COMMAND} --test-dir ${WORK_DIR}/build -L threaded
                        --output-on-failure RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc OR NOT out MATCHES "Downstream.TpGroupsMatchTheMesh/threaded" OR NOT out MATCHES "100% tests passed")
  message(FATAL_ERROR "the downstream SPMD test failed (${rc}):\n${out}")
endif()
execute_process(COMMAND ${CMAKE_CTEST_COMMAND} --test-dir ${WORK_DIR}/build -L prop
                        --output-on-failure RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
# ctest 3.x says "100% tests passed, 0 tests failed out of 2", 4.x "100% tests passed out of 2".
if(rc OR NOT out MATCHES "100% tests passed(, 0 tests failed)? out of 2")
  message(FATAL_ERROR "the downstream properties failed (${rc}):\n${out}")
endif()
execute_process(COMMAND ${WORK_DIR}/prefix/bin/meshsim ops RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(rc OR NOT out MATCHES "composition")
  message(FATAL_ERROR "the installed meshsim tool failed: ${rc}")
endif()
