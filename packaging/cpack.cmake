# Install rules for the desktop resources and the CPack set-up (a .deb and a .tar.gz) for
# Linux. Included by the top-level CMakeLists.txt when the application is built.
#   cmake --build build && cd build && cpack            → granule_<version>_<arch>.deb, .tar.gz
include(GNUInstallDirs)

set(GRANULE_RESOURCES_DIR ${PROJECT_SOURCE_DIR}/resources)
install(FILES ${GRANULE_RESOURCES_DIR}/granule.desktop
        DESTINATION ${CMAKE_INSTALL_DATADIR}/applications)
install(FILES ${GRANULE_RESOURCES_DIR}/io.granule.Granule.metainfo.xml
        DESTINATION ${CMAKE_INSTALL_DATADIR}/metainfo)
# resources/icons/hicolor/<size>/apps/granule.{png,svg} mirrors the icon theme's layout.
install(DIRECTORY ${GRANULE_RESOURCES_DIR}/icons/hicolor
        DESTINATION ${CMAKE_INSTALL_DATADIR}/icons
        FILES_MATCHING PATTERN "granule.png" PATTERN "granule.svg")
# llama.cpp's Jinja engine is linked in when it was built (engine/jinja.cmake): its MIT licence
# goes with the binaries.
if(TARGET granule_jinja)
  install(FILES ${GRANULE_JINJA_DIR}/LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR}
          RENAME LICENSE.llama.cpp-jinja)
endif()

set(CPACK_PACKAGE_NAME granule)
set(CPACK_PACKAGE_VENDOR "Granule developers")
set(CPACK_PACKAGE_CONTACT "Granule developers <granule@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Desktop chat for local language models with a built-in CUDA engine")
set(CPACK_PACKAGE_DESCRIPTION
    "Granule runs GGUF language models on an NVIDIA GPU through CUDA, or on the CPU when \
there is no GPU, and shows live panels of what the GPU memory is doing.")
set(CPACK_PACKAGE_INSTALL_DIRECTORY granule)
set(CPACK_STRIP_FILES ON)
set(CPACK_GENERATOR "DEB;TGZ")

# .deb: dpkg-shlibdeps finds the linked libraries (Qt, spdlog, fmt, PCRE2). What Qt loads
# at run time — QML modules, the platform plugins, the SQLite driver — and the fonts are
# invisible to it, so they are named here. CUDA is not a dependency: the engine loads the
# CUDA libraries at run time and uses the CPU when they are missing.
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(GRANULE_RUNTIME_PACKAGES
    qml6-module-qtquick qml6-module-qtquick-controls qml6-module-qtquick-templates
    qml6-module-qtquick-layouts qml6-module-qtquick-window qml6-module-qtquick-shapes
    qml6-module-qtquick-dialogs qml6-module-qt-labs-folderlistmodel qml6-module-qtqml
    qml6-module-qtqml-models qml6-module-qtqml-workerscript qt6-qpa-plugins
    libqt6sql6-sqlite fonts-dejavu-core)
list(JOIN GRANULE_RUNTIME_PACKAGES ", " CPACK_DEBIAN_PACKAGE_DEPENDS)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "qt6-wayland, qt6-gtk-platformtheme")

include(CPack)
