# Run with `cmake -P` at every build (the always-run target sftctl_share in CMakeLists.txt):
#   -DSRC=<source root> -DOUT=<build>/share/sftctl
# Writes, each only when its content changes (so nothing downstream rebuilds when nothing changed):
#   OUT/SOURCE_ID          the source id: sha256 over the sorted lines "<path>\t<sha256 of content>\n"
#                          of the source files; sftctl, sftd and sftctl-trainer report it
#                          (common/source_id.h)
#   OUT/sftctl-src.tar.gz  those files + SOURCES (their list) + SOURCE_ID: what `sftctl bootstrap`
#                          uploads to build exactly this version on a GPU host
#   OUT/sftctl-host.sh     deploy/host/sftctl-host.sh, the host side of `sftctl bootstrap`
# The files: `git ls-files -co --exclude-standard` in a git checkout (bench/gpu/deps/ left out: a
# download of packages, not source); in an unpacked archive, its SOURCES and SOURCE_ID as they are;
# else (a copy without git) every file below SRC but build*/ and .git/.
cmake_minimum_required(VERSION 3.18)

set(files "")
if(EXISTS "${SRC}/SOURCES" AND EXISTS "${SRC}/SOURCE_ID")
  file(STRINGS "${SRC}/SOURCES" files)
  file(READ "${SRC}/SOURCE_ID" id)
  string(STRIP "${id}" id)
else()
  find_program(GIT git)
  set(git_ok 1)
  if(GIT)
    execute_process(COMMAND "${GIT}" -c core.quotePath=false -C "${SRC}" ls-files -co --exclude-standard
      OUTPUT_VARIABLE listed RESULT_VARIABLE git_ok ERROR_QUIET)
  endif()
  if(GIT AND git_ok EQUAL 0)
    string(REPLACE "\n" ";" files "${listed}")
  else()
    file(GLOB_RECURSE all RELATIVE "${SRC}" "${SRC}/*")
    foreach(f IN LISTS all)
      if(NOT f MATCHES "^(build[^/]*|\\.git)/")
        list(APPEND files "${f}")
      endif()
    endforeach()
  endif()
  list(FILTER files EXCLUDE REGEX "^bench/gpu/deps/")
  list(FILTER files EXCLUDE REGEX "^$")
  set(kept "")
  foreach(f IN LISTS files)
    if(EXISTS "${SRC}/${f}" AND NOT IS_DIRECTORY "${SRC}/${f}")  # deleted but still tracked: skip
      list(APPEND kept "${f}")
    endif()
  endforeach()
  set(files "${kept}")
  list(SORT files)
  set(lines "")
  foreach(f IN LISTS files)
    file(SHA256 "${SRC}/${f}" h)
    string(APPEND lines "${f}\t${h}\n")
  endforeach()
  string(SHA256 id "${lines}")
endif()

function(write_if_changed path content)
  if(EXISTS "${path}")
    file(READ "${path}" old)
    if(old STREQUAL content)
      return()
    endif()
  endif()
  file(WRITE "${path}.tmp" "${content}")
  file(RENAME "${path}.tmp" "${path}")
endfunction()

file(MAKE_DIRECTORY "${OUT}")
if(EXISTS "${SRC}/deploy/host/sftctl-host.sh")
  file(READ "${SRC}/deploy/host/sftctl-host.sh" script)
  write_if_changed("${OUT}/sftctl-host.sh" "${script}")
endif()

# The archive only when the id changed (or it is missing).
set(have "")
if(EXISTS "${OUT}/SOURCE_ID")
  file(READ "${OUT}/SOURCE_ID" have)
  string(STRIP "${have}" have)
endif()
if(have STREQUAL id AND EXISTS "${OUT}/sftctl-src.tar.gz")
  return()
endif()
set(stage "${OUT}/.stage")
file(REMOVE_RECURSE "${stage}")
file(MAKE_DIRECTORY "${stage}")
string(REPLACE ";" "\n" list_text "${files}")
file(WRITE "${stage}/SOURCES" "${list_text}\n")
file(WRITE "${stage}/SOURCE_ID" "${id}\n")
foreach(f IN LISTS files)
  get_filename_component(d "${f}" DIRECTORY)
  file(COPY "${SRC}/${f}" DESTINATION "${stage}/${d}")
endforeach()
list(APPEND files SOURCES SOURCE_ID)
string(REPLACE ";" "\n" all_text "${files}")
file(WRITE "${OUT}/.archive-files" "${all_text}\n")
execute_process(COMMAND "${CMAKE_COMMAND}" -E tar cfz "${OUT}/sftctl-src.tar.gz.tmp" --format=gnutar
  "--files-from=${OUT}/.archive-files"
  WORKING_DIRECTORY "${stage}" RESULT_VARIABLE tar_rc)
if(NOT tar_rc EQUAL 0)
  message(FATAL_ERROR "source_archive: cmake -E tar failed (${tar_rc})")
endif()
file(RENAME "${OUT}/sftctl-src.tar.gz.tmp" "${OUT}/sftctl-src.tar.gz")
file(REMOVE_RECURSE "${stage}")
file(REMOVE "${OUT}/.archive-files")
write_if_changed("${OUT}/SOURCE_ID" "${id}\n")
