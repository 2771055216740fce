#!/bin/bash
# The website an agent edits: the supervisor commits each edit, restarts
# it, and reverts an edit that makes it crash in a loop.
echo "website starting"
exec hello 0.0.0.0:3000
