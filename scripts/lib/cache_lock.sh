# shellcheck shell=bash
# Sourced by the provision_*.sh scripts: `hold_cache_lock PATH` takes an exclusive flock on
# PATH.lock (created beside PATH) for the rest of the calling script, waiting for a run that holds
# it (at most DYN_PROVISION_LOCK_TIMEOUT seconds, default 1800), so runs at once build a cache once
# and share it. Needs a `say` function for progress on stderr.
hold_cache_lock() {
  mkdir -p "$(dirname "$1")"
  exec {cache_lock_fd}>"$1.lock"
  if ! flock -n "$cache_lock_fd"; then
    say "another run holds $1.lock; waiting for it to finish"
    flock -w "${DYN_PROVISION_LOCK_TIMEOUT:-1800}" "$cache_lock_fd" || {
      say "gave up waiting for $1.lock"
      exit 1
    }
  fi
}
