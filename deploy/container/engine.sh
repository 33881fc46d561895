#!/usr/bin/env bash
# engine.sh runs a podman or docker command with the container engine that
# works here, podman first, and the flags this kind of machine needs; make
# image and make test/image go through it, so the flags are in this one
# place (docs/operations.md prints the run flags it adds, and why):
#
#   deploy/container/engine.sh build …   any podman (or docker) command
#   deploy/container/engine.sh --which   prints the engine, or fails saying why
#
# An engine that works, not one that is installed: a docker client without
# a daemon is no engine, so each is asked whether it answers (podman info,
# docker info).
#
# Flags (found on Debian 12's podman 4.3 and runc 1.1, run as root in a VM
# whose root may not raise its own limits, like CI's):
#
#   --runtime runc   where runc is installed. crun, podman's default runtime
#                    when both are installed, is known to refuse the cgroups
#                    of these machines (cgroup v1, no systemd; not installed
#                    here to try again); runc runs containers there.
#   --ulimit nofile=4096:4096 --ulimit nproc=4096:4096   on run and create.
#                    Run as root, podman asks the runtime for 1048576 open
#                    files and as many processes, whatever its own limits;
#                    a root without CAP_SYS_RESOURCE cannot raise a hard
#                    limit above its own (here 20000 files, and 32768
#                    processes for podman's conmon), and the container does
#                    not start: "error setting rlimit type 7 (6): operation
#                    not permitted". 4096 fits under both; serve and proxy
#                    then hold up to 3072 connections (--max-conns: three
#                    quarters of the open files). A --ulimit of the
#                    caller's own comes after these and wins.
#
# What was not needed: podman picks the cgroupfs cgroup manager and the
# file events log by itself (podman info: cgroupManager, eventLogger), PID 1
# not being systemd, and its overlay storage works on this kernel; nothing
# is pulled, the image being FROM scratch; and no file under /etc is
# written. docker gets no flags (it is not installed with a daemon here, so
# untested).
set -euo pipefail

engine=()
why="no podman"
if command -v podman >/dev/null 2>&1; then
  podman=(podman)
  if command -v runc >/dev/null 2>&1; then podman+=(--runtime runc); fi
  if out=$("${podman[@]}" info 2>&1 >/dev/null); then engine=("${podman[@]}")
  else why="${podman[*]} info: ${out%%$'\n'*}"; fi
fi
if [ ${#engine[@]} = 0 ]; then
  if ! command -v docker >/dev/null 2>&1; then why+="; no docker"
  elif out=$(docker info 2>&1 >/dev/null); then engine=(docker)
  else why+="; docker info: ${out%%$'\n'*}"; fi
fi
if [ ${#engine[@]} = 0 ]; then
  echo "engine.sh: no container engine works ($why): apt-get install podman runc" >&2
  exit 127
fi

if [ "${1:-}" = --which ]; then
  echo "${engine[0]}"
  exit 0
fi
if [ "${engine[0]}" = podman ]; then
  case "${1:-}" in
    run | create) set -- "$1" --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 "${@:2}" ;;
  esac
fi
exec "${engine[@]}" "$@"
