# Run with `cmake -P` at every build (the always-run target sftctl_share in CMakeLists.txt):
#   -DSRC=<source root> -DOUT=<build>/share/sftctl
# Writes, each only when its content changes (so nothing downstream rebuilds when nothing changed):
#   OUT/SOURCE_ID          the source id: sha256 over the sorted lines "<path>\t<sha256 of content>\n"
#                          of the source files; sftctl, sftd and sftctl-trainer report it
#                          (common/source_id.h)
#   OUT/sftctl-src.tar.gz  those files + SOURCES (their list) + SOURCE_ID: what `sftctl bootstrap`
#                          uploads to build exactly this version on a GPU host
#   OUT/sftctl-host.sh     deploy/host/sftctl-host.sh, the host side of `sftctl bootstrap`
# The files: what the build reads -- the top-level CMakeLists.txt and CMakePresets.json and the
# folders below (`parts`) -- and nothing else of the checkout (no docs/, bench/, dotfiles such as
# an untracked .env: the archive goes to every GPU host). In a git checkout (SRC/.git), the files
# git tracks there (`git ls-files`, never an untracked one); in an unpacked archive, its SOURCES
# and SOURCE_ID as they are; else (a copy without git) every file beneath those folders. Either
# way no path with a component starting with "." or named __pycache__, and no *.pyc.
# tests/ and bench/ stay home: a host builds no tests (the host presets turn them off, and the
# top-level CMakeLists.txt reads tests/ only where it exists).
cmake_minimum_required(VERSION 3.18)

set(parts cmake proto common agent trainer client deploy)
set(top_files CMakeLists.txt CMakePresets.json)
list(JOIN parts "|" parts_re)
string(REPLACE "." "\\." top_re "${top_files}")
list(JOIN top_re "|" top_re)
set(wanted_re "^((${top_re})|(${parts_re})/.+)$")

set(files "")
if(EXISTS "${SRC}/SOURCES" AND EXISTS "${SRC}/SOURCE_ID")
  file(STRINGS "${SRC}/SOURCES" files)
  file(READ "${SRC}/SOURCE_ID" id)
  string(STRIP "${id}" id)
else()
  find_program(GIT git)
  set(git_ok 1)
  if(GIT AND EXISTS "${SRC}/.git")
    execute_process(COMMAND "${GIT}" -c core.quotePath=false -C "${SRC}" ls-files
      OUTPUT_VARIABLE listed RESULT_VARIABLE git_ok ERROR_QUIET)
  endif()
  if(git_ok EQUAL 0)
    string(REPLACE "\n" ";" files "${listed}")
    # New source files are built on a host only once git tracks them: say which are not yet.
    execute_process(COMMAND "${GIT}" -c core.quotePath=false -C "${SRC}" ls-files -o --exclude-standard
      -- ${parts} ${top_files} OUTPUT_VARIABLE untracked ERROR_QUIET)
    string(REPLACE "\n" ";" untracked "${untracked}")
    list(FILTER untracked INCLUDE REGEX "${wanted_re}")
    list(FILTER untracked EXCLUDE REGEX "(^|/)(\\.|__pycache__/)|\\.pyc$")
    if(untracked)
      list(JOIN untracked ", " untracked)
      message(STATUS "source_archive: not packed, as git does not track them (git add): ${untracked}")
    endif()
  else()
    foreach(p IN LISTS parts)
      file(GLOB_RECURSE all RELATIVE "${SRC}" "${SRC}/${p}/*")
      list(APPEND files ${all})
    endforeach()
    list(APPEND files ${top_files})
  endif()
  list(FILTER files INCLUDE REGEX "${wanted_re}")
  list(FILTER files EXCLUDE REGEX "(^|/)(\\.|__pycache__/)|\\.pyc$")
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
