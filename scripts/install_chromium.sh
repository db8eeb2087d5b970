#!/usr/bin/env bash
# make setup: Debian's chromium for the one test that reads the report in a real browser, installed where this
# user may (root, or passwordless sudo, with apt-get). Never fails the setup: without it that test is skipped,
# saying why and how to install it.
set -u
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ]; then
  sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo="sudo -n"
else
  echo "make setup: chromium is not installed and installing it needs root (sudo apt-get install chromium);" \
       "the browser test of the report will be skipped"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "make setup: no apt-get here to install chromium; the browser test of the report will be skipped"
  exit 0
fi
echo "make setup: installing Debian's chromium (apt-get) for the report's browser test"
if ! ($sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
      --no-install-recommends chromium) >/dev/null 2>&1; then
  echo "make setup: apt-get could not install chromium; the browser test of the report will be skipped"
fi
exit 0
