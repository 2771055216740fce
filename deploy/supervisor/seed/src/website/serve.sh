#!/bin/sh
# The example service an agent edits: this directory, served by python3 on
# 127.0.0.1:$PORT. The supervisor commits each edit, restarts it, and
# reverts an edit that makes it crash in a loop.
exec python3 -m http.server "${PORT:-3000}" --bind 127.0.0.1
