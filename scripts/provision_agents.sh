#!/usr/bin/env bash
# Install pinned coding-agent CLIs (OpenAI Codex, Claude Code, OpenCode) from npm into a cached
# prefix, and print that prefix: its bin/ holds `codex`, `claude` and `opencode`.
#
#   AGENTS=$(scripts/provision_agents.sh)     # then: $AGENTS/bin/codex exec ..., $AGENTS/bin/claude -p ...
#
# - @openai/codex, @anthropic-ai/claude-code and opencode-ai at the versions below (override with
#   CODEX_VERSION, CLAUDE_CODE_VERSION, OPENCODE_VERSION). Each is a JS shim plus a native binary
#   shipped in a per-platform npm package (an optionalDependency); Claude Code's and OpenCode's
#   postinstall scripts copy that binary into place, so scripts must run. Nothing is downloaded from
#   outside the npm registry, and Node 20 is enough (Claude Code's package asks for Node >= 22, but its
#   `claude` is the native binary, not a Node program). About 1.2 GB on disk.
# - OpenCode bundles the @ai-sdk/openai-compatible provider, so a provider declared with
#   "npm": "@ai-sdk/openai-compatible" needs no download at run time. What OpenCode does fetch, in the
#   background, is @opencode-ai/plugin into each config directory ($XDG_CONFIG_HOME/opencode); it skips
#   that when the directory holds node_modules/ and a package-lock.json whose packages[""].dependencies
#   names @opencode-ai/plugin (see tests/fixtures/agents/README.md), and a failed fetch is only logged.
#
# The prefix is cached (default ${XDG_CACHE_HOME:-~/.cache}/dyn/agents-codex<v>-claude<v>-opencode<v>,
# or $DYN_AGENTS_PREFIX): a second run only checks it. Progress goes to stderr; stdout is the path.
# Runs at once share the cache safely: each holds an exclusive flock on <prefix>.lock (beside the
# prefix) while it checks or builds it, so a second run waits for the first (at most
# DYN_PROVISION_LOCK_TIMEOUT seconds, default 1800) and then reuses what it built.
# DYN_PROVISION_BUILD=CMD runs `CMD <prefix>` instead of the npm install (the tests' way to exercise
# the cache and its lock without a download); CMD must leave executable bin/codex, bin/claude and
# bin/opencode, which are then not run.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
codex_version=${CODEX_VERSION:-0.171.0}
claude_version=${CLAUDE_CODE_VERSION:-2.1.332}
opencode_version=${OPENCODE_VERSION:-1.18.33}
prefix=${DYN_AGENTS_PREFIX:-${XDG_CACHE_HOME:-$HOME/.cache}/dyn/agents-codex$codex_version-claude$claude_version-opencode$opencode_version}
npm=${NPM:-npm}
stamp="$prefix/.dyn-agents"
want="@openai/codex@$codex_version @anthropic-ai/claude-code@$claude_version opencode-ai@$opencode_version"
say() { echo "provision_agents: $*" >&2; }

# each CLI must start and print its version (this runs the native binaries, not just the JS shims)
check() {
  local dir=$1 tmp rc=0
  [ -x "$dir/bin/codex" ] && [ -x "$dir/bin/claude" ] && [ -x "$dir/bin/opencode" ] || return 1
  [ -n "${DYN_PROVISION_BUILD:-}" ] && return 0
  tmp=$(mktemp -d)
  mkdir -p "$tmp/.codex"
  # the CLIs write state under HOME even for --version: keep the user's home out of it
  for cli in codex claude opencode; do
    env HOME="$tmp" XDG_CONFIG_HOME="$tmp/.config" XDG_CACHE_HOME="$tmp/.cache" XDG_DATA_HOME="$tmp/.local/share" \
      XDG_STATE_HOME="$tmp/.local/state" CODEX_HOME="$tmp/.codex" DISABLE_AUTOUPDATER=1 \
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 OPENCODE_DISABLE_AUTOUPDATE=1 \
      "$dir/bin/$cli" --version </dev/null >&2 || { rc=$?; break; }
  done
  rm -rf "$tmp"
  return $rc
}

# shellcheck source=scripts/lib/cache_lock.sh
source "$repo/scripts/lib/cache_lock.sh"
hold_cache_lock "$prefix"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && check "$prefix" 2>/dev/null; then
  say "cached $prefix"
else
  say "installing $want into $prefix (under a minute; about 1.2 GB)"
  rm -rf "$prefix"
  if [ -n "${DYN_PROVISION_BUILD:-}" ]; then
    $DYN_PROVISION_BUILD "$prefix" >&2
  else
    # -g with --prefix puts the packages in $prefix/lib/node_modules and their bins in $prefix/bin
    "$npm" install -g --prefix "$prefix" --no-fund --no-audit --loglevel=error \
      --include=optional --ignore-scripts=false --engine-strict=false \
      "@openai/codex@$codex_version" "@anthropic-ai/claude-code@$claude_version" "opencode-ai@$opencode_version" >&2
  fi
  check "$prefix" || { say "the installed CLIs do not run"; exit 1; }
  echo "$want" > "$stamp"
fi
echo "$prefix"
