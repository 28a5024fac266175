# The Granule window. granule_gui is a static QML module (URI Granule) holding every C++
# type and QML file, so the tests link exactly what the executable runs; `granule` adds main.
qt_standard_project_setup()
set(QT_QML_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/qml)

set(GRANULE_QML_DIR ${CMAKE_SOURCE_DIR}/resources/qml)
file(GLOB GRANULE_QML_FILES CONFIGURE_DEPENDS ${GRANULE_QML_DIR}/*.qml)
foreach(qml_file ${GRANULE_QML_FILES})
  # The QML lives in resources/qml; inside the module it sits at the top.
  get_filename_component(qml_name ${qml_file} NAME)
  set_source_files_properties(${qml_file} PROPERTIES QT_RESOURCE_ALIAS ${qml_name})
  if(qml_name STREQUAL "Theme.qml" OR qml_name STREQUAL "Units.qml")
    set_source_files_properties(${qml_file} PROPERTIES QT_QML_SINGLETON_TYPE TRUE)
  endif()
endforeach()

set(GRANULE_GUI_LIB_SOURCES ${GRANULE_GUI_SOURCES})
list(FILTER GRANULE_GUI_LIB_SOURCES EXCLUDE REGEX "/main\\.cpp$")
file(GLOB GRANULE_GUI_HEADERS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.h)
# Remote engines (a chat on an OpenAI-compatible server) need the remote client (libcurl).
if(NOT GRANULE_HAVE_REMOTE)
  list(FILTER GRANULE_GUI_LIB_SOURCES EXCLUDE REGEX "/remote_inference_engine\\.cpp$")
  list(FILTER GRANULE_GUI_HEADERS EXCLUDE REGEX "/remote_inference_engine\\.h$")
endif()

qt_add_library(granule_gui STATIC)
qt_add_qml_module(granule_gui
  URI Granule
  VERSION 1.0
  RESOURCE_PREFIX /qt/qml
  SOURCES ${GRANULE_GUI_LIB_SOURCES} ${GRANULE_GUI_HEADERS}
  QML_FILES ${GRANULE_QML_FILES}
  DEPENDENCIES QtQuick QtQuick.Controls QtQuick.Layouts QtQml.Models)
target_include_directories(granule_gui PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(granule_gui PUBLIC
  Qt6::Core Qt6::Gui Qt6::Quick Qt6::QuickControls2 Qt6::Sql granule::engine)
target_compile_options(granule_gui PRIVATE -Wall -Wextra)
# The Hub page (search, fit and download models) with the token in the system keychain.
if(GRANULE_HAVE_HUB)
  find_package(Qt6Keychain QUIET)
  if(Qt6Keychain_FOUND)
    target_link_libraries(granule_gui PUBLIC granule::hub qt6keychain)
    target_compile_definitions(granule_gui PRIVATE GRANULE_HAVE_HUB=1)
  else()
    message(STATUS "QtKeychain for Qt 6 not found (Debian: qtkeychain-qt6-dev): the window has no Hub page")
  endif()
endif()
if(GRANULE_HAVE_REMOTE)
  target_link_libraries(granule_gui PUBLIC granule::remote)
  target_compile_definitions(granule_gui PUBLIC GRANULE_HAVE_REMOTE=1)
endif()
# Tools from MCP servers (Settings) when the MCP client is built.
if(TARGET granule_mcp)
  target_link_libraries(granule_gui PUBLIC granule::mcp)
  target_compile_definitions(granule_gui PRIVATE GRANULE_HAVE_MCP=1)
endif()
# The window serves the OpenAI API from its engine (Settings) when the server library is built.
if(TARGET granule_server)
  target_link_libraries(granule_gui PUBLIC granule_server)
  target_compile_definitions(granule_gui PRIVATE GRANULE_WINDOW_SERVER=1)
endif()

qt_add_executable(granule main.cpp)
target_link_libraries(granule PRIVATE granule_gui granule_guiplugin)
target_compile_definitions(granule PRIVATE GRANULE_VERSION="${PROJECT_VERSION}")
install(TARGETS granule RUNTIME DESTINATION bin)

# qmllint over the module: `cmake --build <dir> --target granule_gui_qmllint`.
