#!/usr/bin/env bash
# Install, upgrade or uninstall the tpumon agent on one TPU VM (idempotent: run it again to
# upgrade, or after a failed run). docs/deploy.md has the one-liner for every worker of a pod.
#
#   sudo deploy/install.sh [--from SOURCE] [--slack-webhook-file F] [--pagerduty-key-file F]
#   sudo deploy/install.sh --uninstall [--purge]
#
# SOURCE is what pip installs: this checkout (default), a wheel, or e.g. "tpumon==0.2.0".
# --root DIR installs into a scratch root instead of / (packaging, tests): the same files,
# the user created there by systemd-sysusers, the unit enabled there by systemctl --root;
# nothing is started.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root=/
source_spec="$(dirname "$here")"
python=python3
venv_args=()
slack_file=""
pagerduty_file=""
action=install
purge=no

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "install.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --from) source_spec="${2:?--from needs a value}"; shift 2 ;;
    --root) root="${2:?--root needs a directory}"; shift 2 ;;
    --python) python="${2:?--python needs a value}"; shift 2 ;;
    --system-site-packages) venv_args+=(--system-site-packages); shift ;;
    --slack-webhook-file) slack_file="${2:?}"; shift 2 ;;
    --pagerduty-key-file) pagerduty_file="${2:?}"; shift 2 ;;
    --uninstall) action=uninstall; shift ;;
    --purge) purge=yes; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

root="${root%/}"
prefix="$root/opt/tpumon"
etc="$root/etc/tpumon"
unit_dir="$root/etc/systemd/system"
sysusers="$root/usr/lib/sysusers.d/tpumon.conf"
live=$([ -z "$root" ] && echo yes || echo no)   # the running system: systemctl may act

[ "$live" = no ] || [ "$(id -u)" -eq 0 ] || die "run as root (sudo), or give --root DIR"
for f in $slack_file $pagerduty_file; do   # before anything changes
  [ -r "$root$f" ] || die "cannot read $root$f (a secret file for LoadCredential=)"
done

systemctl_() {
  if [ "$live" = yes ]; then systemctl "$@"; else systemctl --root="$root" "$@" 2>/dev/null || true; fi
}

create_user() {
  install -d -m 0755 "$(dirname "$sysusers")" "$root/etc"
  printf 'u tpumon - "tpumon agent" /var/lib/tpumon\n' > "$sysusers"
  if [ "$live" = yes ]; then systemd-sysusers "$sysusers"
  else systemd-sysusers --root="$root" "$sysusers"; fi
  gid="$(awk -F: '$1 == "tpumon" { print $3 }' "$root/etc/group")"
  [ -n "$gid" ] || die "systemd-sysusers did not create the tpumon group"
}

install_files() {
  install -d -m 0755 "$prefix" "$unit_dir"
  install -d -m 0750 -g "$gid" "$etc"
  # Each install gets a fresh venv beside the old one; the venv symlink is swapped to it
  # only once it works, so an upgrade that fails half-way leaves the running agent alone.
  local fresh
  fresh="venv-$(date +%Y%m%d%H%M%S)-$$"
  "$python" -m venv "${venv_args[@]}" "$prefix/$fresh"
  "$prefix/$fresh/bin/python" -m pip install --quiet --disable-pip-version-check "$source_spec"
  "$prefix/$fresh/bin/tpumon" version >/dev/null
  ln -sfn "$fresh" "$prefix/venv.next" && mv -T "$prefix/venv.next" "$prefix/venv"
  for old in "$prefix"/venv-*; do [ "$old" = "$prefix/$fresh" ] || rm -rf "$old"; done
  install -m 0644 "$here/systemd/tpumon.service" "$unit_dir/tpumon.service"
  # The configuration is the operator's: written once, never overwritten by an upgrade.
  [ -e "$etc/config.toml" ] ||
    install -m 0640 -g "$gid" "$here/tpumon.toml.example" "$etc/config.toml"
  install_credentials
}

install_credentials() {
  local dropin="$unit_dir/tpumon.service.d/credentials.conf" lines=""
  [ -z "$slack_file" ] || lines+="LoadCredential=slack-webhook-url:$slack_file"$'\n'
  [ -z "$pagerduty_file" ] || lines+="LoadCredential=pagerduty-routing-key:$pagerduty_file"$'\n'
  [ -n "$lines" ] || return 0
  install -d -m 0755 "$(dirname "$dropin")"
  printf '[Service]\n%s' "$lines" > "$dropin"
}

do_install() {
  create_user
  install_files
  systemctl_ daemon-reload
  systemctl_ enable tpumon.service
  if [ "$live" = yes ]; then
    systemctl restart tpumon.service
    echo "tpumon $("$prefix/venv/bin/tpumon" version | head -1) running: systemctl status tpumon"
  else
    echo "tpumon installed under $root (not started)"
  fi
}

remove_user() {   # --purge: the tpumon user and group that create_user made
  local at=()
  [ "$live" = yes ] || at=(--root "$root")
  if grep -q '^tpumon:' "$root/etc/passwd" 2>/dev/null; then userdel "${at[@]}" tpumon; fi
  if grep -q '^tpumon:' "$root/etc/group" 2>/dev/null; then groupdel "${at[@]}" tpumon; fi
}

do_uninstall() {
  if [ "$live" = yes ]; then systemctl disable --now tpumon.service 2>/dev/null || true
  else systemctl_ disable tpumon.service; fi
  rm -rf "$prefix" "$unit_dir/tpumon.service" "$unit_dir/tpumon.service.d" "$sysusers"
  systemctl_ daemon-reload
  if [ "$purge" = yes ]; then
    rm -rf "$etc" "$root/var/lib/tpumon"
    remove_user
    echo "tpumon removed, with its configuration, history, user and group"
  else
    echo "tpumon removed; kept $etc and $root/var/lib/tpumon (--purge removes them)"
  fi
}

"do_$action"
