#!/usr/bin/env bash
# Makes the real inputs the corpora were first seeded with (fuzz/corpus/*
# holds them, minimised, with what the fuzzers found since). Re-run it
# only to re-seed: `fuzz/seed.sh && scripts/fuzz.sh cmin TARGET`.
# Deterministic: the same ids every time (fixed names and dates).
set -euo pipefail
cd "$(dirname "$0")"
root=$PWD
seeds=$root/seeds
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- pack_index: real packs from `git pack-objects` over a base commit the
# target rebuilds with git2 (file `a` = "a\n", message "base", t <t@localhost>).
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@localhost GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@localhost
export GIT_AUTHOR_DATE="1700000000 +0000" GIT_COMMITTER_DATE="1700000000 +0000"
repo=$work/repo
git init -q -b main "$repo"
printf 'a\n' >"$repo/a"
git -C "$repo" add a
git -C "$repo" commit -qm base
base=$(git -C "$repo" rev-parse HEAD)
mkdir -p "$repo/src"
seq 1 400 | sed 's/^/line of text number /' >"$repo/src/f.txt"
printf '#!/bin/sh\necho hi\n' >"$repo/run.sh"
chmod +x "$repo/run.sh"
ln -s src/f.txt "$repo/link"
git -C "$repo" add -A
GIT_AUTHOR_DATE="1700000100 +0000" GIT_COMMITTER_DATE="1700000100 +0000" git -C "$repo" commit -qm one
sed -i 's/number 200$/number two hundred/' "$repo/src/f.txt"
GIT_AUTHOR_DATE="1700000200 +0000" GIT_COMMITTER_DATE="1700000200 +0000" git -C "$repo" commit -qam two
tip=$(git -C "$repo" rev-parse HEAD)
echo "$base" >"$seeds/pack_index.base"
echo "$tip" >"$seeds/pack_index.wanted"
out=$seeds/pack_index
rm -rf "$out" && mkdir -p "$out"
pack() { printf '%s\n' "$@" | git -C "$repo" pack-objects --stdout --revs -q; }
pack "$tip" "^$base" >"$out/tip-less-base.pack"
pack "$tip" >"$out/whole-history.pack"
pack "$tip" "^$tip~1" >"$out/last-commit-only.pack"
printf '%s\n' "$tip" "^$base" | git -C "$repo" pack-objects --stdout --revs -q --depth=0 >"$out/no-deltas.pack"
pack "$base" "^$base" >"$out/empty.pack"

# --- tree_names: the raw trees of that history (git's own bytes).
out=$seeds/tree_names
rm -rf "$out" && mkdir -p "$out"
n=0
for rev in "$base^{tree}" "$tip~1^{tree}" "$tip^{tree}" "$tip:src"; do
  n=$((n + 1))
  git -C "$repo" cat-file tree "$rev" >"$out/tree-$n"
done

# --- policy_rules: the shipped rule file and the documented example.
out=$seeds/policy_rules
rm -rf "$out" && mkdir -p "$out"
cp ../policies/rules/*.toml "$out/"
sed -n '/^\[\[rule\]\]/,/^```/p' ../docs/policy-hook.md | sed '/^```/d' >"$out/policy-hook-example.toml"
# Two files, the second retiring a rule of the first (NUL between files).
{ cat ../policies/rules/default.toml; printf '\0'
  printf '[[retire]]\nrule = "ask-before-ask"\nreason = "r"\nauthority = "owner"\n'; } >"$out/two-files.bin"

# --- door_frame and gateway_sse: frames and streams as the protocol and
# the test model (tests/src/model.rs) send them.
python3 - "$seeds" <<'PY'
import json, os, struct, sys
seeds = sys.argv[1]
def put(target, name, data):
    d = os.path.join(seeds, target)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, name), "wb").write(data)
def frame(obj):
    body = json.dumps(obj, separators=(",", ":")).encode()
    return struct.pack(">I", len(body)) + body
C = "0123456789abcdef0123456789abcdef01234567"
reqs = {
    "push": {"door": "push", "remote": "origin", "dst_ref": "refs/heads/agent/x",
             "claimed_commit": C, "force": False, "delete": False, "pack_bytes": 1234},
    "delete": {"door": "push", "remote": "origin", "dst_ref": "refs/heads/agent/x",
               "claimed_commit": "0" * 40, "force": False, "delete": True, "pack_bytes": 0},
    "pull_request": {"door": "pull_request", "remote": "origin", "base": "refs/heads/main",
                     "head": "refs/heads/agent/x", "head_commit": C, "pack_bytes": 1234,
                     "title": "Fix the parser", "body": "It no longer panics.\n\nDetails."},
    "notify": {"door": "notify", "destination": "team-chat", "body": "done \u202e"},
    "ask": {"door": "ask", "body": "Which branch?"},
    "policy_check": {"door": "policy_check", "payload": {"tool_name": "Bash",
                     "tool_input": {"command": "ls"}, "cwd": "/workspace"}},
}
for name, r in reqs.items():
    put("door_frame", "req-" + name, frame({"v": 3, "request": r}))
put("door_frame", "req-push-then-pack", frame({"v": 3, "request": reqs["push"]}) + b"PACK\0\0\0\2")
put("door_frame", "req-v2", frame({"v": 2, "request": reqs["ask"]}))
put("door_frame", "oversized-header", b"\xff\xff\xff\xff{")
resps = [{"verdict": "refused", "rule": "r-12", "reason": "no"},
         {"verdict": "queued", "act": "01J0000000000000000000000"},
         {"verdict": "done", "detail": ""},
         {"verdict": "error", "reason": "bad\nline"},
         {"verdict": "asks", "rule": "r-7", "reason": "a person decides"}]
for i, r in enumerate(resps):
    put("door_frame", "resp-%d" % i, frame({"v": 3, "response": r}))

def ev(data, name=None):
    s = ("event: %s\n" % name if name else "") + "data: " + json.dumps(data) + "\n\n"
    return s.encode()
usage_chat = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
              "prompt_tokens_details": {"cached_tokens": 4}}
chunk = lambda choices: {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                         "model": "m", "choices": choices}
chat = (ev(chunk([{"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": None}]))
        + ev(chunk([{"index": 0, "delta": {}, "finish_reason": "stop"}]))
        + ev(dict(chunk([]), usage=usage_chat)) + b"data: [DONE]\n\n")
ru = {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 10}, "output_tokens": 9,
      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 39}
resp = (ev({"type": "response.created", "sequence_number": 0, "response": {"status": "in_progress", "usage": None}}, "response.created")
        + ev({"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_1", "delta": "hi"}, "response.output_text.delta")
        + ev({"type": "response.completed", "sequence_number": 2, "response": {"status": "completed", "usage": ru}}, "response.completed"))
msgs = (ev({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 20,
             "cache_creation_input_tokens": 3, "cache_read_input_tokens": 7, "output_tokens": 1}}}, "message_start")
        + ev({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}, "content_block_delta")
        + b": heartbeat\n\n"
        + ev({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 11}}, "message_delta")
        + ev({"type": "message_stop"}, "message_stop"))
malformed = b"data: {not json\n\nevent: response.completed\ndata: [1,2\n\ndata: \x00\x01garbage\n:\n\n"
for shape, name, stream in [(0, "chat", chat), (0x10, "chat-usage-asked", chat), (1, "responses", resp),
                            (2, "messages", msgs), (2, "messages-crlf", msgs.replace(b"\n", b"\r\n")),
                            (0, "malformed", malformed)]:
    put("gateway_sse", name, bytes([shape, 7]) + stream)
put("gateway_sse", "whole-json", bytes([0, 64]) + json.dumps({"usage": usage_chat}).encode())

# gateway_request: byte 0 = shape (0 chat, 1 responses, 2 messages) | 0x04
# server tools enabled | 0x08 public content | 0x30 most choices - 1; then
# the body, as the agents send them (request.rs's tests, the real agents).
msgs_body = {"model": "claude-x", "max_tokens": 4096, "stream": True,
    "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0"}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]}],
    "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}],
    "thinking": {"type": "enabled", "budget_tokens": 1024}}
msgs_tool = {"model": "c", "max_tokens": 5, "messages": [],
    "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
msgs_url = {"model": "c", "max_tokens": 5, "messages": [{"role": "user", "content": [
    {"type": "image", "source": {"type": "url", "url": "https://x/?secret"}}]}]}
chat_body = {"model": "gpt-5", "messages": [{"role": "system", "content": "be brief"},
    {"role": "user", "content": [{"type": "text", "text": "hi"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0"}}]},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "exec", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
    "tools": [{"type": "function", "function": {"name": "exec", "parameters": {"type": "object"}}}],
    "stream": True, "stream_options": {"include_usage": True}, "n": 2, "max_tokens": 50}
chat_plain = {"model": "gpt-5", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 9}
resp_body = {"model": "gpt-5-codex", "instructions": "x", "store": False,
    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
              {"type": "reasoning", "summary": [], "encrypted_content": "abc"},
              {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "c", "output": "ok"}],
    "tools": [{"type": "function", "name": "exec_command", "parameters": {}, "strict": False},
              {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}}],
    "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low"}, "stream": True}
resp_prev = {"model": "g", "input": "hi", "previous_response_id": "resp_1"}
for how, name, body in [(2, "messages", msgs_body), (2 | 0x04 | 0x08, "messages-server-tool", msgs_tool),
                        (2, "messages-url-image", msgs_url), (0 | 0x10, "chat", chat_body),
                        (0, "chat-plain", chat_plain), (1, "responses", resp_body), (1, "responses-stored", resp_prev)]:
    put("gateway_request", name, bytes([how]) + json.dumps(body).encode())
PY
