#!/usr/bin/env bash
# Soft-RoCE VM suite: boots Debian's kernel in a QEMU TCG guest, loads the kernel's rdma_rxe
# driver on a veth pair and runs named scenarios (rdma-core and perftest baselines, the
# project's verbs driver, soft <-> kernel interop, the uctel-collector and uctel-agent daemons
# on verbs). See tests/rxe/README.md.
#
# Host packages this script needs (Debian 12; .ci/run installs them):
#   qemu-system-x86 busybox-static cpio            boot the guest, build its initramfs
#   libibverbs-dev librdmacm-dev libclang-dev pkg-config
#                                                  build the project's binaries with
#                                                  `--features verbs` (rdma-sys 0.3.0)
#   plus apt (apt-get download, apt-cache), dpkg-deb, gzip, ldd: present on every Debian;
#   strip: binutils, which the Rust build needs anyway (its linker).
# Nothing is installed by this script. Guest packages are fetched with `apt-get download` into
# a cache (default target/rxe-cache/) and unpacked there, never installed on the host.
#
# Usage: tests/rxe/run.sh [SCENARIO...]      (no argument: every scenario, in order)
# Environment:
#   UCTEL_RXE_TIMEOUT   seconds before the guest is killed (default 600)
#   UCTEL_RXE_CACHE     download cache (default <repo>/target/rxe-cache)
#   UCTEL_RXE_WORK      initramfs tree, image and serial log (default <repo>/target/rxe-work)
#   UCTEL_RXE_NO_BUILD  1: do not run cargo; use the binaries already in target/dist
#   UCTEL_RXE_VERBOSE   1: the guest prints every scenario's output, not only on failure
#   MANY_AGENTS, MANY_LINES, MANY_CONNECT_SECONDS, DAEMON_LINES
#                       scenario sizes, handed to the guest's scenarios when set (whole
#                       numbers; see SCENARIO_VARS below and tests/rxe/README.md)
# Exit status: 0 when every requested scenario printed PASS; 1 when one failed, is missing, or
# the guest timed out; 2 on a setup error (missing package, download or build failure).
set -euo pipefail

SUITE_START=$(date +%s)
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${UCTEL_RXE_CACHE:-$REPO/target/rxe-cache}"
WORK="${UCTEL_RXE_WORK:-$REPO/target/rxe-work}"
TIMEOUT="${UCTEL_RXE_TIMEOUT:-600}"

# Scenarios in run order; each is tests/rxe/scenarios/<name>.sh, run by the guest's /init.
# daemons_verbs_many is not in the list (run it by name): 64 agents overload the 2-vCPU TCG
# guest (load 70-108, memory draining), and with 16 agents frames are lost on the clean link
# on both data paths; see tests/rxe/README.md.
ALL_SCENARIOS=(
  ibv_uc_pingpong
  perftest_send_uc
  verbs_send
  verbs_write_imm
  verbs_no_recv_wr
  soft_to_rxe
  rxe_to_soft
  multi_packet_uc
  rc_soft_to_rxe
  rc_rxe_to_soft
  verbs_async_events
  verbs_send_bench
  verbs_srq
  daemons_verbs
  daemons_soft_to_verbs
  daemons_rc
)

# Variables of the host's environment that reach the guest's scenarios (written to
# /scenarios/ENV, which the guest's /init exports): the sizes a scenario reads, so a cheaper
# run can be asked for from the host, e.g. `MANY_AGENTS=16 tests/rxe/run.sh daemons_verbs_many`.
# Only whole numbers are taken.
SCENARIO_VARS=(MANY_AGENTS MANY_LINES MANY_CONNECT_SECONDS DAEMON_LINES)

# Binaries of the project built with `--features verbs` and copied into the guest
# (transport/examples/<name>.rs).
RUST_EXAMPLES=(rxe_uc)
# The daemons, built with their `verbs` feature (collector/, agent/).
RUST_DAEMONS=(uctel-collector uctel-agent)

# Guest user space, from Debian's package registry. The library packages after iproute2 are
# what `ip` and `rdma` link to, fetched so the guest never depends on what the host happens
# to have installed; libc and libgcc come from the host (same Debian release).
GUEST_PACKAGES=(
  libibverbs1 ibverbs-providers ibverbs-utils rdma-core perftest libibumad3 libpci3
  libnl-3-200 libnl-route-3-200 librdmacm1 iproute2
  libbpf1 libelf1 libmnl0 libbsd0 libmd0 libcap2 zlib1g
)

# Kernel modules, in load order (each one's dependencies come before it). crc32_generic must be
# there: rxe allocates a crc32 transform for the ICRC and `rdma link add` fails without it.
MODULES=(
  crypto/crc32_generic
  drivers/infiniband/core/ib_core
  drivers/infiniband/core/ib_uverbs
  net/ipv4/udp_tunnel
  net/ipv6/ip6_udp_tunnel
  drivers/infiniband/sw/rxe/rdma_rxe
  drivers/net/veth
)

log() { printf '[rxe] %s\n' "$*" >&2; }
die() {
  printf '[rxe] error: %s\n' "$*" >&2
  exit 2
}

# ---------------------------------------------------------------- scenarios asked for
if [ "$#" -gt 0 ]; then
  SCENARIOS=("$@")
else
  SCENARIOS=("${ALL_SCENARIOS[@]}")
fi
for s in "${SCENARIOS[@]}"; do
  [ "$s" != common ] && [ -f "$HERE/scenarios/$s.sh" ] || die "unknown scenario '$s' (no tests/rxe/scenarios/$s.sh)"
done
SCENARIO_ENV=""
for v in "${SCENARIO_VARS[@]}"; do
  [ -n "${!v:-}" ] || continue
  [[ "${!v}" =~ ^[0-9]+$ ]] || die "$v='${!v}': a whole number is expected"
  SCENARIO_ENV+="$v=${!v}"$'\n'
done

# ---------------------------------------------------------------- host prerequisites
missing=()
for cmd in qemu-system-x86_64 cpio gzip apt-get apt-cache dpkg-deb ldd timeout strip; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
BUSYBOX=/bin/busybox
if [ ! -x "$BUSYBOX" ] || ldd "$BUSYBOX" >/dev/null 2>&1; then
  missing+=("static busybox at $BUSYBOX")
fi
if [ "${UCTEL_RXE_NO_BUILD:-0}" != 1 ]; then
  command -v cargo >/dev/null 2>&1 || missing+=(cargo)
  command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
  if command -v pkg-config >/dev/null 2>&1; then
    pkg-config --exists libibverbs || missing+=("libibverbs (pkg-config)")
    pkg-config --exists librdmacm || missing+=("librdmacm (pkg-config)")
  fi
  compgen -G "/usr/lib/llvm-*/lib/libclang.so" >/dev/null || missing+=("libclang.so")
fi
if [ "${#missing[@]}" -gt 0 ]; then
  printf '[rxe] error: missing on the host: %s\n' "${missing[*]}" >&2
  printf '[rxe] install with: apt-get install -y qemu-system-x86 busybox-static cpio' >&2
  printf ' libibverbs-dev librdmacm-dev libclang-dev pkg-config\n' >&2
  exit 2
fi

# ---------------------------------------------------------------- guest packages
mkdir -p "$CACHE/debs"

# The kernel: the current linux-image-6.1.0-*-amd64 behind the linux-image-amd64 metapackage.
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null |
  awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$KPKG" ] || die "cannot resolve linux-image-amd64 to a kernel package (run apt-get update)"
KVER=${KPKG#linux-image-}

# Candidate versions of every package in one apt-cache call, then one apt-get download for
# those not in the cache yet.
declare -A DEB=()
want=("$KPKG" "${GUEST_PACKAGES[@]}")
declare -A CANDIDATE=()
while read -r pkg ver; do CANDIDATE[$pkg]=$ver; done < <(
  apt-cache policy "${want[@]}" 2>/dev/null |
    awk '/^[^ ].*:$/ {sub(/:$/, ""); p = $0} /^  Candidate:/ {print p, $2}'
)
fetch=()
for p in "${want[@]}"; do
  ver=${CANDIDATE[$p]:-}
  [ -n "$ver" ] && [ "$ver" != "(none)" ] ||
    die "apt has no candidate for '$p' (run apt-get update)"
  f=$(compgen -G "$CACHE/debs/${p}_${ver//:/%3a}_*.deb" | head -n 1 || true)
  if [ -n "$f" ]; then DEB[$p]=$f; else fetch+=("$p=$ver"); fi
done
if [ "${#fetch[@]}" -gt 0 ]; then
  log "apt-get download ${fetch[*]}"
  (cd "$CACHE/debs" && apt-get download -q "${fetch[@]}" 2>&1 | grep -v -e unsandboxed -e '^Get:' >&2) ||
    true
  for p in "${want[@]}"; do
    ver=${CANDIDATE[$p]}
    f=$(compgen -G "$CACHE/debs/${p}_${ver//:/%3a}_*.deb" | head -n 1 || true)
    [ -n "$f" ] || die "apt-get download $p ($ver) failed"
    DEB[$p]=$f
  done
fi

KDEB=${DEB[$KPKG]}
KROOT="$CACHE/kernel-$KVER"
if [ ! -f "$KROOT/.done" ]; then
  log "unpacking $(basename "$KDEB")"
  rm -rf "$KROOT"
  mkdir -p "$KROOT"
  paths=("./boot/vmlinuz-$KVER")
  for m in "${MODULES[@]}"; do paths+=("./lib/modules/$KVER/kernel/$m.ko"); done
  dpkg-deb --fsys-tarfile "$KDEB" | tar -x -C "$KROOT" "${paths[@]}" ||
    die "unpacking $KDEB failed (module paths changed?)"
  touch "$KROOT/.done"
fi

GROOT="$CACHE/guest-root"
stamp=""
debs=()
for p in "${GUEST_PACKAGES[@]}"; do
  d=${DEB[$p]}
  debs+=("$d")
  stamp+="$(basename "$d") "
done
if [ ! -f "$GROOT/.stamp" ] || [ "$(cat "$GROOT/.stamp")" != "$stamp" ]; then
  log "unpacking ${#debs[@]} guest packages"
  rm -rf "$GROOT"
  mkdir -p "$GROOT"
  for d in "${debs[@]}"; do dpkg-deb -x "$d" "$GROOT"; done
  printf '%s' "$stamp" >"$GROOT/.stamp"
fi

# ---------------------------------------------------------------- project binaries
RUST_BINS=()
if [ "${UCTEL_RXE_NO_BUILD:-0}" != 1 ]; then
  # Profile dist (release code in target/dist/, as the Debian packages ship it): the suite
  # never overwrites what `cargo build --release` put in target/release/.
  log "cargo build --profile dist --features verbs: ${RUST_EXAMPLES[*]} ${RUST_DAEMONS[*]}"
  targets=()
  for e in "${RUST_EXAMPLES[@]}"; do targets+=(--example "$e"); done
  for b in "${RUST_DAEMONS[@]}"; do targets+=(--bin "$b"); done
  (cd "$REPO" && cargo build --profile dist --locked -q \
    -p uctel-transport -p uctel-collector -p uctel-agent \
    --features uctel-transport/verbs,uctel-collector/verbs,uctel-agent/verbs \
    "${targets[@]}") || die "cargo build failed"
fi
for e in "${RUST_EXAMPLES[@]}"; do RUST_BINS+=("$REPO/target/dist/examples/$e"); done
for b in "${RUST_DAEMONS[@]}"; do RUST_BINS+=("$REPO/target/dist/$b"); done
for b in "${RUST_BINS[@]}"; do [ -x "$b" ] || die "missing $b"; done

# ---------------------------------------------------------------- initramfs
INITRD_DIR="$WORK/initramfs"
rm -rf "$INITRD_DIR"
mkdir -p "$INITRD_DIR"/{bin,sbin,usr/bin,usr/sbin,lib64,lib/x86_64-linux-gnu,etc/libibverbs.d} \
  "$INITRD_DIR"/{dev,proc,sys,tmp,run,root,scenarios,modules} \
  "$INITRD_DIR/usr/lib/x86_64-linux-gnu/libibverbs"

cp "$BUSYBOX" "$INITRD_DIR/bin/busybox"
# Applets as links in /bin only. busybox's own `ip` is left out: it cannot make veth pairs or
# move links between namespaces, and it would shadow iproute2's `ip` (RXE-VM.md pitfall).
for a in $("$BUSYBOX" --list); do
  case "$a" in busybox | ip) continue ;; esac
  ln -sf busybox "$INITRD_DIR/bin/$a"
done

GLIB="$GROOT/lib/x86_64-linux-gnu:$GROOT/usr/lib/x86_64-linux-gnu"
PROVIDER="$GROOT/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so"
[ -f "$PROVIDER" ] || die "ibverbs-providers has no librxe-rdmav34.so"
[ -f "$GROOT/etc/libibverbs.d/rxe.driver" ] || die "ibverbs-providers has no rxe.driver"

# guest path <- host file
declare -A FILES=(
  [/usr/sbin/ip]="$GROOT/bin/ip"
  [/usr/sbin/rdma]="$GROOT/usr/bin/rdma"
  [/usr/bin/ibv_devices]="$GROOT/usr/bin/ibv_devices"
  [/usr/bin/ibv_devinfo]="$GROOT/usr/bin/ibv_devinfo"
  [/usr/bin/ibv_uc_pingpong]="$GROOT/usr/bin/ibv_uc_pingpong"
  [/usr/bin/ib_send_bw]="$GROOT/usr/bin/ib_send_bw"
  [/usr/bin/ib_write_bw]="$GROOT/usr/bin/ib_write_bw"
  [/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so]="$PROVIDER"
  [/etc/libibverbs.d/rxe.driver]="$GROOT/etc/libibverbs.d/rxe.driver"
)
for b in "${RUST_BINS[@]}"; do FILES[/usr/bin/$(basename "$b")]="$b"; done
# The guest gets copies without debug info (symbols stay, so a panic's backtrace still names
# functions), in case the profile keeps some; a smaller initramfs boots faster under TCG.
declare -A STRIP=()
for b in "${RUST_BINS[@]}"; do STRIP[/usr/bin/$(basename "$b")]=1; done

declare -A LIBS=()
for dst in "${!FILES[@]}"; do
  src=${FILES[$dst]}
  [ -f "$src" ] || die "missing $src"
  install -D -m 0755 "$src" "$INITRD_DIR$dst"
  if [ -n "${STRIP[$dst]:-}" ]; then
    strip --strip-debug "$INITRD_DIR$dst" || die "strip $dst failed"
  fi
  case "$dst" in /etc/*) continue ;; esac
  out=$(LD_LIBRARY_PATH="$GLIB" ldd "$src" 2>&1) || die "ldd $src failed: $out"
  if grep -q 'not found' <<<"$out"; then
    die "$(basename "$src") needs libraries that neither the guest packages nor the host have:
$(grep 'not found' <<<"$out")"
  fi
  while read -r lib; do LIBS[$lib]=1; done < <(awk '/=> \// {print $3} /^\t\/.*ld-linux/ {print $1}' <<<"$out")
done
for lib in "${!LIBS[@]}"; do
  case "$(basename "$lib")" in
    ld-linux-x86-64.so.2) cp -L "$lib" "$INITRD_DIR/lib64/ld-linux-x86-64.so.2" ;;
    *) cp -L "$lib" "$INITRD_DIR/lib/x86_64-linux-gnu/$(basename "$lib")" ;;
  esac
done

for m in "${MODULES[@]}"; do
  cp "$KROOT/lib/modules/$KVER/kernel/$m.ko" "$INITRD_DIR/modules/"
  printf '%s.ko\n' "$(basename "$m")" >>"$INITRD_DIR/modules/ORDER"
done

install -m 0755 "$HERE/guest/init" "$INITRD_DIR/init"
install -m 0644 "$HERE/scenarios/common.sh" "$INITRD_DIR/scenarios/common.sh"
for s in "${SCENARIOS[@]}"; do
  install -m 0755 "$HERE/scenarios/$s.sh" "$INITRD_DIR/scenarios/$s.sh"
  printf '%s\n' "$s" >>"$INITRD_DIR/scenarios/LIST"
done
printf '%s' "$SCENARIO_ENV" >"$INITRD_DIR/scenarios/ENV"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$INITRD_DIR/etc/passwd"
printf 'root:x:0:\n' >"$INITRD_DIR/etc/group"

INITRD="$WORK/initrd.gz"
(cd "$INITRD_DIR" && find . -print0 | cpio --quiet -o -0 -H newc -R 0:0 | gzip -1 >"$INITRD")
log "initramfs $(du -h "$INITRD" | cut -f1), kernel $KVER, scenarios: ${SCENARIOS[*]}"
[ -z "$SCENARIO_ENV" ] || log "scenario variables: $(tr '\n' ' ' <<<"$SCENARIO_ENV")"

# ---------------------------------------------------------------- boot
SERIAL="$WORK/serial.log"
rm -f "$SERIAL"
# Line by line (stdbuf, sed -u): the serial log and the guest's INFO lines show where a long
# scenario stands while it runs, not in 4 KiB blocks.
log "booting qemu (TCG, 2 vCPUs, 2 GiB), timeout ${TIMEOUT}s; serial log: $SERIAL"
BOOT_START=$(date +%s)
set +e
timeout -k 10 "$TIMEOUT" qemu-system-x86_64 \
  -accel tcg,thread=multi -cpu max -m 2048 -smp 2 \
  -nographic -no-reboot -nic none \
  -kernel "$KROOT/boot/vmlinuz-$KVER" -initrd "$INITRD" \
  -append "console=ttyS0 quiet panic=-1 uctel.verbose=${UCTEL_RXE_VERBOSE:-0}" \
  </dev/null 2>&1 | stdbuf -oL tr -d '\r' | tee "$SERIAL" |
  sed -u -n 's/^\(SCENARIO\|BENCH\|INFO\|LOG\|SUITE\) /  guest: &/p'
status=${PIPESTATUS[0]}
set -e
BOOT_END=$(date +%s)

# ---------------------------------------------------------------- verdict
echo
echo "rxe suite ($KVER, guest ran $((BOOT_END - BOOT_START)) s):"
failed=0
for s in "${SCENARIOS[@]}"; do
  line=$(grep -E "^SCENARIO $s (PASS|FAIL)( |$)" "$SERIAL" | tail -n 1 || true)
  if [ -z "$line" ]; then
    printf '  %-28s MISSING\n' "$s"
    failed=1
  else
    read -r _ _ verdict detail <<<"$line"
    printf '  %-28s %s %s\n' "$s" "$verdict" "$detail"
    [ "$verdict" = PASS ] || failed=1
  fi
done
grep -E '^BENCH ' "$SERIAL" | sed 's/^/  /' || true
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
  echo "  guest timed out after ${TIMEOUT}s"
  failed=1
elif ! grep -q '^SUITE END' "$SERIAL"; then
  echo "  guest stopped before the end of the suite (qemu exit $status); see $SERIAL"
  failed=1
fi
echo "  wall time $(($(date +%s) - SUITE_START)) s"
if [ "$failed" -ne 0 ]; then
  echo "rxe suite FAILED (serial log: $SERIAL)"
  exit 1
fi
echo "rxe suite passed"
