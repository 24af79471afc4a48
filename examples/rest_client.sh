#!/usr/bin/env bash
# narrmem over HTTP with curl: ingest -> recall -> forget.
# Start the server first:   narrmem serve            (127.0.0.1:8765, no key needed on loopback)
# With keys:                narrmem keys create --tenant acme   then   NM_KEY=nmk_... ./rest_client.sh
set -euo pipefail
BASE="${NM_URL:-http://127.0.0.1:8765}"
AUTH=()
if [ -n "${NM_KEY:-}" ]; then AUTH=(-H "Authorization: Bearer $NM_KEY"); fi
post() { curl -sS --fail-with-body "${AUTH[@]}" -H "Content-Type: application/json" -X POST "$BASE$1" -d "$2"; echo; }

echo "== ingest (ts left out: the server's now)"
post /v1/ingest '{"text": "I decided to quit my job", "user_id": "u1", "chat_id": "c1", "message_id": "m1"}'
echo "== ingest again: a duplicate, nothing more stored (the answer names what the first call stored)"
post /v1/ingest '{"text": "I decided to quit my job", "user_id": "u1", "chat_id": "c1", "message_id": "m1"}'
echo "== recall with each hit's why"
post /v1/recall '{"query": "what did I decide about work?", "scope": {"user_id": "u1"}, "k": 3, "explain": true}'
echo "== forget the user"
post /v1/forget '{"user_id": "u1"}'
