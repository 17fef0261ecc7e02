# plan/: profile, cluster description, cost model, layout search, spot-trace simulator.
# Pure files (trireme/plan/*.cpp) go to trireme_core and are unit-tested without libtorch;
# the measuring side of `trireme profile` (trireme/plan/torch/*.cpp) needs libtorch.
file(GLOB TRIREME_PLAN_PURE CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
file(GLOB TRIREME_PLAN_TORCH CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/torch/*.cpp)
target_sources(trireme_core PRIVATE ${TRIREME_PLAN_PURE})
target_sources(trireme PRIVATE ${TRIREME_PLAN_TORCH})
# The device catalog (devices.json) is compiled in, so `trireme plan` needs no data path.
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/devices.json)
file(READ ${CMAKE_CURRENT_LIST_DIR}/devices.json TRIREME_DEVICES_JSON)
configure_file(${CMAKE_CURRENT_LIST_DIR}/devices_json.cpp.in
  ${CMAKE_BINARY_DIR}/generated/trireme/plan/devices_json.cpp @ONLY)
target_sources(trireme_core PRIVATE ${CMAKE_BINARY_DIR}/generated/trireme/plan/devices_json.cpp)
