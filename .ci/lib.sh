# Helpers shared by the CI steps that run containers (sourced, not run).

# podman, buildah and runc from Debian's packages (and jq, curl, openssl), and the
# settings that make them work without a daemon here (deploy/image/containers.conf).
ensure_podman() {
  local missing=()
  for tool in jq curl openssl; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]} (Debian)"
    apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if ! command -v podman >/dev/null 2>&1 || ! command -v buildah >/dev/null 2>&1 ||
    ! command -v runc >/dev/null 2>&1; then
    echo "== installing podman, buildah, runc (Debian)"
    apt-get update -qq && apt-get install -y -qq podman buildah runc >/dev/null
  fi
  export CONTAINERS_CONF="$PWD/deploy/image/containers.conf"
}

# A CA, a server certificate for localhost/127.0.0.1 and client certificates, in $1:
# ca.crt, tls.crt, tls.key, and CN.crt/CN.key for each "CN:ORG" argument after it.
make_certs() {
  local dir="$1"
  shift
  mkdir -p "$dir"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=fleetscope CI CA" -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=fleetscope" \
    -keyout "$dir/tls.key" -out "$dir/tls.csr" 2>/dev/null
  openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 2 -out "$dir/tls.crt" 2>/dev/null \
    -extfile <(printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n')
  local client cn org
  for client in "$@"; do
    cn="${client%%:*}"
    org="${client#*:}"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$cn/O=$org" \
      -keyout "$dir/$cn.key" -out "$dir/$cn.csr" 2>/dev/null
    openssl x509 -req -in "$dir/$cn.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
      -CAcreateserial -days 2 -out "$dir/$cn.crt" 2>/dev/null \
      -extfile <(printf 'extendedKeyUsage=clientAuth\n')
  done
  rm -f "$dir"/*.csr "$dir/ca.srl"
  # The container's user (65532) reads them through a read-only mount.
  chmod 0644 "$dir"/*
}

# Runs "$@" until it succeeds, for at most $WAIT_SECONDS (default 120) seconds.
wait_until() {
  local deadline=$((SECONDS + ${WAIT_SECONDS:-120}))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "timed out waiting for: $*" >&2
      return 1
    fi
    sleep 0.5
  done
}

# Fails with $1 unless the rest of the arguments, run, succeed.
check() {
  local what="$1"
  shift
  if "$@" >/dev/null; then
    echo "ok: $what"
  else
    echo "FAILED: $what" >&2
    return 1
  fi
}
