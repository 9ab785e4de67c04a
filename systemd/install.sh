#!/usr/bin/env bash
# Install soakd from this checkout for soakd@.service:
#   PREFIX/venv            a virtualenv with soakd (pip install .) and torch
#   BINDIR/soakd           a link to PREFIX/venv/bin/soakd (the unit's ExecStart)
#   UNITDIR/soakd@.service the template unit (ExecStart follows BINDIR; SOAKD_CONFIG and
#                          both EnvironmentFile= lines follow CONFDIR)
#   CONFDIR/soakd.env      the example environment (kept if already there)
#   SYSUSERSDIR/soakd.conf the soakd system user and group (created with systemd-sysusers)
#
#   sudo systemd/install.sh                       # /opt/soakd, /usr/local/bin, /etc/...
#   systemd/install.sh --root /tmp/trial          # every path under /tmp/trial
#   grep -E '^(ExecStart|Environment|EnvironmentFile)=' /tmp/trial/etc/systemd/system/soakd@.service
#
# Options (or the environment variable named in capitals; an option wins):
#   --root DIR        prefix every path below (a trial or staging install; the venv is not
#                     relocatable, so the link and the venv's scripts point inside DIR; the
#                     unit names the paths without DIR, as the host will see them)
#   --prefix DIR      venv parent (PREFIX, default /opt/soakd)
#   --bindir DIR      link folder (BINDIR, default /usr/local/bin)
#   --unitdir DIR     unit folder (UNITDIR, default /etc/systemd/system)
#   --confdir DIR     config folder (CONFDIR, default /etc/soakd): the installed unit runs
#                     CONFDIR/NAME.toml and reads CONFDIR/soakd.env, CONFDIR/NAME.env
#   --sysusersdir DIR sysusers.d folder (SYSUSERSDIR, default /usr/lib/sysusers.d)
#   --python PY       the Python that creates the venv (PYTHON, default python3)
#   --reuse-site-packages
#                     `pip install --no-deps` into a venv that sees PY's site-packages (PY
#                     a venv's python: that venv's packages); offline, for tests
#   --no-user         do not create the soakd user and group
# torch: kept when the venv can import one (a CUDA build on a GPU host); otherwise the CPU
# build 2.13.0 (the rule of .ci/setup).
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${ROOT:-} PREFIX=${PREFIX:-/opt/soakd} BINDIR=${BINDIR:-/usr/local/bin}
UNITDIR=${UNITDIR:-/etc/systemd/system} CONFDIR=${CONFDIR:-/etc/soakd}
SYSUSERSDIR=${SYSUSERSDIR:-/usr/lib/sysusers.d} PYTHON=${PYTHON:-python3}
reuse=0 make_user=1

die() { echo "install.sh: error: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --root|--prefix|--bindir|--unitdir|--confdir|--sysusersdir|--python)
      [ $# -ge 2 ] || die "$1 needs a value"
      name=$(echo "${1#--}" | tr a-z A-Z); [ "$name" = ROOT ] || [ -n "$2" ] || die "$1 is empty"
      printf -v "$name" '%s' "$2"; shift 2 ;;
    --reuse-site-packages) reuse=1; shift ;;
    --no-user) make_user=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
command -v "$PYTHON" >/dev/null || die "--python: $PYTHON not found"
ROOT=${ROOT%/}
# the unit names BINDIR and CONFDIR: systemd wants absolute paths, splits on whitespace
# and expands % (specifiers)
for name in BINDIR CONFDIR; do
  dir=${!name} opt="--$(echo "$name" | tr A-Z a-z) ($name)"
  case "$dir" in /*) ;; *) die "$opt must be an absolute path, got '$dir'" ;; esac
  case "$dir" in
    *[[:space:]%\\\|\&]*) die "$opt may not contain whitespace, %, \\, | or &, got '$dir'" ;;
  esac
  [ "$dir" = / ] || printf -v "$name" '%s' "${dir%/}"
done
VENV=$ROOT$PREFIX/venv

pip() { "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@"; }
# --reuse-site-packages: PY's own site-packages go on the new venv's path through a .pth
# file (a venv made from a venv's python would otherwise see only the base Python's).
reuse_site_packages() {
  local dest
  dest=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
  "$PYTHON" -c "import site; print('\n'.join(site.getsitepackages()))" > "$dest/_soakd_reuse.pth"
}

make_venv() {
  if [ "$reuse" = 1 ]; then
    "$PYTHON" -m venv --without-pip "$VENV"  # pip and setuptools: PY's
    reuse_site_packages
  else
    "$PYTHON" -m venv "$VENV"
  fi
  if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
    pip install "torch==2.13.0"
  fi
  # pip builds in the source folder: build from a copy, so the checkout stays clean (and
  # may be read-only)
  local tree
  tree=$(mktemp -d)
  trap 'rm -rf "$tree"' RETURN
  tar -C "$SRC" --exclude=__pycache__ -cf - pyproject.toml README.md soakd | tar -C "$tree" -xf -
  if [ "$reuse" = 1 ]; then
    pip install --no-deps --no-build-isolation "$tree"
  else
    pip install "$tree"
  fi
  "$VENV/bin/soakd" --version >/dev/null || die "$VENV/bin/soakd does not run"
}

install_files() {
  install -d "$ROOT$BINDIR" "$ROOT$UNITDIR" "$ROOT$CONFDIR" "$ROOT$SYSUSERSDIR"
  ln -sfn "$VENV/bin/soakd" "$ROOT$BINDIR/soakd"
  # one setting: the unit reads the folder install.sh fills (CONFDIR, without ROOT)
  sed -e "s|^ExecStart=/usr/local/bin/soakd |ExecStart=$BINDIR/soakd |" \
    -e "s|/etc/soakd/|$CONFDIR/|g" \
    "$SRC/systemd/soakd@.service" > "$ROOT$UNITDIR/soakd@.service"
  chmod 0644 "$ROOT$UNITDIR/soakd@.service"
  [ -e "$ROOT$CONFDIR/soakd.env" ] || install -m 0644 "$SRC/systemd/soakd.env" "$ROOT$CONFDIR/soakd.env"
  install -m 0644 "$SRC/systemd/soakd.sysusers" "$ROOT$SYSUSERSDIR/soakd.conf"
}

make_user() {
  if command -v systemd-sysusers >/dev/null; then
    systemd-sysusers ${ROOT:+--root="$ROOT"} "$ROOT$SYSUSERSDIR/soakd.conf"
  elif [ -z "$ROOT" ] && ! getent passwd soakd >/dev/null; then
    useradd --system --user-group --home-dir /var/lib/soakd --no-create-home \
      --shell /usr/sbin/nologin soakd
  fi
}

make_venv
install_files
[ "$make_user" = 1 ] && make_user
if [ -z "$ROOT" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi
echo "install.sh: soakd $("$VENV/bin/soakd" --version | cut -d' ' -f2) in $VENV;" \
  "$ROOT$BINDIR/soakd, $ROOT$UNITDIR/soakd@.service, $ROOT$CONFDIR/soakd.env"
echo "install.sh: next: put a config in $CONFDIR/NAME.toml, \`systemctl start soakd@NAME\`;" \
  "operators who run \`soakd gate\`: \`usermod -aG soakd USER\`"
