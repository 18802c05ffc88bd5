# dtrain_add_plugin(<name> SOURCES ... [LIBRARIES ...])
#
# Builds libdtrain_<name>.so as a MODULE against the SDK headers only: hidden
# visibility, every symbol resolved at link time (-z defs), and only the
# dtrain_backend_v* entry points exported (version script). Works in the dtrain
# tree and, through find_package(dtrain), in any other project.
set(_DTRAIN_PLUGIN_CMAKE_DIR ${CMAKE_CURRENT_LIST_DIR})

# dtrain_plugin_requires(<name> <package> <debian packages>)
#
# In a plugin's folder: find_package(<package> CONFIG); where it is missing,
# says which Debian packages provide it and skips the rest of the folder.
macro(dtrain_plugin_requires name package debian)
  find_package(${package} CONFIG QUIET)
  if(NOT ${package}_FOUND)
    message(STATUS "dtrain: skipping the ${name} plugin: ${package} not found (Debian: ${debian})")
    return()
  endif()
endmacro()

function(dtrain_add_plugin name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT P_SOURCES)
    message(FATAL_ERROR "dtrain_add_plugin(${name}): no SOURCES")
  endif()
  set(target dtrain_${name})
  add_library(${target} MODULE ${P_SOURCES})
  target_link_libraries(${target} PRIVATE dtrain::sdk ${P_LIBRARIES})
  set(map ${_DTRAIN_PLUGIN_CMAKE_DIR}/plugin.map)
  target_link_options(${target} PRIVATE -Wl,-z,defs -Wl,--version-script=${map})
  set_target_properties(${target} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME dtrain_${name}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LINK_DEPENDS ${map})
  if(DEFINED DTRAIN_PLUGIN_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${DTRAIN_PLUGIN_OUTPUT_DIRECTORY})
  endif()
  if(DEFINED DTRAIN_INSTALL_PLUGINDIR)
    install(TARGETS ${target} LIBRARY DESTINATION ${DTRAIN_INSTALL_PLUGINDIR})
  endif()
endfunction()
