#!/usr/bin/env bash
# CPU side: the committed repo (git archive HEAD, gzipped, ~2 MB) as the git-ignored carry folder .head,
# so a device pipeline runs exactly what is committed, not whatever the working tree holds mid-edit.
# On the device: `mkdir -p /tmp/dspark-repo && tar -xzf .head/repo.tar.gz -C /tmp/dspark-repo`, then
# start run_all.sh from /tmp/dspark-repo (its $WORK: it then copies nothing).
set -euo pipefail
grep -qxF "/.head/" .git/info/exclude || echo "/.head/" >>.git/info/exclude
rm -rf .head && mkdir -p .head
git archive --format=tar.gz -o .head/repo.tar.gz HEAD
git rev-parse HEAD >.head/COMMIT
du -sh .head/repo.tar.gz; cat .head/COMMIT
