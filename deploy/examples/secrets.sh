#!/usr/bin/env bash
# Makes the Secrets the examples need, as manifests to apply (nothing secret is kept in Git):
#
#   deploy/examples/secrets.sh hub OUT [NATS-NAME…]   the hub's Secrets (namespace multipilot-hub) in OUT/hub/;
#                                                     NATS-NAME: extra DNS names of the NATS certificate, e.g.
#                                                     the name agents in other clusters reach the bus by
#   deploy/examples/secrets.sh agent CLUSTER OUT      one agent's Secrets (namespace multipilot) in
#                                                     OUT/agent-CLUSTER/, from what `hub` made in OUT
#
# The generated material (passwords, CA key, tokens, signing key) stays in OUT/material/: keep it like any
# other secret. Running `hub` again reuses it and adds what is missing (a new agent user's password, the
# console's token for the TSDB, the TSDB's token for the alert router). Needs openssl, xxd and kubectl
# (offline: --dry-run=client).
# HUB_NAMESPACE and AGENT_NAMESPACE override the namespaces.
set -euo pipefail
umask 077

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HUB_NS="${HUB_NAMESPACE:-multipilot-hub}"
AGENT_NS="${AGENT_NAMESPACE:-multipilot}"

die() { echo "secrets.sh: $*" >&2; exit 1; }
for tool in openssl xxd kubectl; do command -v "$tool" >/dev/null || die "$tool not found"; done

# a random secret that starts with a letter (NATS and the hub's environment parsing read a leading digit as a
# number)
random() { echo "p$(openssl rand -hex 24)"; }

secret() { # NAMESPACE NAME ARGS… > manifest
  local ns="$1" name="$2"; shift 2
  kubectl create secret generic "$name" --namespace "$ns" --dry-run=client -o yaml "$@"
}

hash_of() { printf '%s' "$1" | openssl dgst -sha256 -r | cut -d' ' -f1; }

has_subject() { # TOKENS SUBJECT: whether TOKENS has an entry for SUBJECT (flow or block style)
  grep -Eq "subject: $2([ ,}]|\$)" "$1"
}

add_token() { # TOKENS PLAIN SUBJECT ROLE: a new token for SUBJECT unless TOKENS has one: the token in PLAIN,
  # its SHA-256 in TOKENS (what the hub reads)
  has_subject "$1" "$3" && return
  local t
  t="$(random)"
  [ -z "$(tail -c 1 "$2")" ] || echo >> "$2"
  echo "- {token: \"$t\", subject: $3, role: $4}" >> "$2"
  [ -z "$(tail -c 1 "$1")" ] || echo >> "$1"
  echo "- {token_sha256: $(hash_of "$t"), subject: $3, role: $4}" >> "$1"
}

hash_plain() { # TOKENS PLAIN: an earlier version's plain entries of TOKENS move to PLAIN; TOKENS keeps digests
  grep -q '^- {token: "' "$1" || return 0
  local line tmp="$1.tmp"
  : > "$tmp"
  while IFS= read -r line; do
    if [[ "$line" =~ ^-\ \{token:\ \"([^\"]+)\",\ (.*)$ ]]; then
      has_subject "$2" "$(sed -n 's/.*subject: \([^,}]*\).*/\1/p' <<< "$line")" || echo "$line" >> "$2"
      echo "- {token_sha256: $(hash_of "${BASH_REMATCH[1]}"), ${BASH_REMATCH[2]}" >> "$tmp"
    else
      echo "$line" >> "$tmp"
    fi
  done < "$1"
  mv "$tmp" "$1"
  echo "the tokens in $1 are kept as their SHA-256 now; the tokens themselves are in $2"
}

token_of() { # PLAIN SUBJECT > value: SUBJECT's token without a final newline (a Secret key's value)
  local t
  t="$(sed -n "s/.*token: \"\([^\"]*\)\", subject: $2,.*/\1/p" "$1" | sed -n 1p)"
  [ -n "$t" ] || die "no token for the subject $2 in $1"
  printf '%s' "$t"
}

hub() {
  local out="$1"; shift
  local m="$out/material"
  mkdir -p "$m" "$out/hub"

  # one password per variable accounts.conf reads: a user added there since the last run gets one too
  touch "$m/nats-passwords.env"
  grep -o '\$MULTIPILOT_[A-Z0-9_]*_PASSWORD' "$ROOT/deploy/nats/accounts.conf" | tr -d '$' | sort -u |
    while read -r var; do
      grep -q "^$var=" "$m/nats-passwords.env" || echo "$var=$(random)" >> "$m/nats-passwords.env"
    done

  if [ ! -f "$m/ca.key" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
      -subj "/CN=MultiPilot NATS CA" -keyout "$m/ca.key" -out "$m/ca.crt" 2>/dev/null
  fi
  if [ ! -f "$m/tls.key" ]; then
    local sans="DNS:nats,DNS:nats.$HUB_NS,DNS:nats.$HUB_NS.svc,DNS:nats.$HUB_NS.svc.cluster.local"
    sans="$sans,DNS:*.nats-headless.$HUB_NS.svc.cluster.local,DNS:*.nats-headless.$HUB_NS.svc"
    for name in "$@"; do sans="$sans,DNS:$name"; done
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=nats" \
      -keyout "$m/tls.key" -out "$m/tls.csr" 2>/dev/null
    # one certificate for clients and routes: routes authenticate each other with it (client auth)
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n' \
      "$sans" > "$m/tls.ext"
    openssl x509 -req -in "$m/tls.csr" -CA "$m/ca.crt" -CAkey "$m/ca.key" -CAcreateserial -days 825 \
      -extfile "$m/tls.ext" -out "$m/tls.crt" 2>/dev/null
  fi

  # the bearer tokens of every HTTP API (console, TSDB, alert router): one per role for people, then the
  # console's own viewer token for the TSDB and the TSDB's operator token for the alert router, which takes
  # the alerts of the TSDB's rules. tokens.yaml (the Secret's, what the hub reads) keeps only each token's
  # SHA-256; the tokens themselves stay here, in api-tokens.plain.yaml, to hand out (an older tokens.yaml
  # with plain tokens is converted; teams from `multipilot team add` are kept)
  touch "$m/tokens.yaml" "$m/api-tokens.plain.yaml"
  hash_plain "$m/tokens.yaml" "$m/api-tokens.plain.yaml"
  add_token "$m/tokens.yaml" "$m/api-tokens.plain.yaml" viewer viewer
  add_token "$m/tokens.yaml" "$m/api-tokens.plain.yaml" operator operator
  add_token "$m/tokens.yaml" "$m/api-tokens.plain.yaml" releaser releaser
  add_token "$m/tokens.yaml" "$m/api-tokens.plain.yaml" console viewer
  add_token "$m/tokens.yaml" "$m/api-tokens.plain.yaml" tsdb-rules operator
  # the Secret's key tsdb_token (console.tsdb_token, tsdb.peer_token) and alerts_token (tsdb.alertmanager_token)
  token_of "$m/api-tokens.plain.yaml" console > "$m/tsdb-token"
  token_of "$m/api-tokens.plain.yaml" tsdb-rules > "$m/alerts-token"
  # earlier versions' Secrets, replaced by multipilot-api-tokens: not applied again
  local old
  for old in multipilot-console-tokens multipilot-alerts-tokens; do
    if [ -f "$out/hub/$old.yaml" ]; then
      rm "$out/hub/$old.yaml"
      echo "the Secret $old is no longer used (multipilot-api-tokens replaces it): kubectl -n $HUB_NS delete secret $old"
    fi
  done

  if [ ! -f "$m/signing.key" ]; then
    openssl genpkey -algorithm ed25519 -out "$m/signing.pem"
    openssl pkey -in "$m/signing.pem" -outform DER | tail -c 32 | xxd -p -c 64 > "$m/signing.key"
    openssl pkey -in "$m/signing.pem" -pubout -outform DER | tail -c 32 | xxd -p -c 64 > "$m/signing.key.pub"
  fi

  secret "$HUB_NS" multipilot-nats-passwords --from-env-file="$m/nats-passwords.env" \
    > "$out/hub/multipilot-nats-passwords.yaml"
  secret "$HUB_NS" nats-tls --from-file=ca.crt="$m/ca.crt" --from-file=tls.crt="$m/tls.crt" \
    --from-file=tls.key="$m/tls.key" > "$out/hub/nats-tls.yaml"
  secret "$HUB_NS" multipilot-api-tokens --from-file=tokens.yaml="$m/tokens.yaml" \
    --from-file=tsdb_token="$m/tsdb-token" --from-file=alerts_token="$m/alerts-token" \
    > "$out/hub/multipilot-api-tokens.yaml"
  secret "$HUB_NS" multipilot-release-signing --from-file=signing.key="$m/signing.key" \
    > "$out/hub/multipilot-release-signing.yaml"
  echo "hub Secrets in $out/hub/ (kubectl apply -f $out/hub/); API tokens (viewer, operator, releaser) in $m/api-tokens.plain.yaml (the hub keeps only their SHA-256, in $m/tokens.yaml)"
}

agent() {
  local cluster="$1" out="$2"
  local m="$out/material"
  [ -f "$m/nats-passwords.env" ] || die "run '$0 hub $out' first"
  # the subject token of the cluster name, as accounts.conf spells its variable: upper case, - as _
  local var
  var="MULTIPILOT_AGENT_$(echo "$cluster" | tr '[:lower:]-' '[:upper:]_')_PASSWORD"
  local password
  password="$(grep "^$var=" "$m/nats-passwords.env" | cut -d= -f2-)" ||
    die "no $var in $m/nats-passwords.env: add the user agent-$cluster to deploy/nats/accounts.conf, run '$0 hub $out' again and apply the new multipilot-nats-passwords"
  mkdir -p "$out/agent-$cluster"
  secret "$AGENT_NS" multipilot-agent-nats --from-literal=password="$password" --from-file=ca.crt="$m/ca.crt" \
    > "$out/agent-$cluster/multipilot-agent-nats.yaml"
  secret "$AGENT_NS" multipilot-release-trust --from-file=signing.key.pub="$m/signing.key.pub" \
    > "$out/agent-$cluster/multipilot-release-trust.yaml"
  echo "agent Secrets for $cluster in $out/agent-$cluster/ (apply them in that cluster)"
}

case "${1:-}" in
  hub) [ $# -ge 2 ] || die "usage: $0 hub OUT [NATS-NAME…]"; shift; hub "$@" ;;
  agent) [ $# -eq 3 ] || die "usage: $0 agent CLUSTER OUT"; agent "$2" "$3" ;;
  *) die "usage: $0 hub OUT [NATS-NAME…] | $0 agent CLUSTER OUT" ;;
esac
