#!/usr/bin/env bash
# Install the system packages the launcher integration tests need (Slurm, munge, Open MPI,
# MPICH, PMIx headers for srun --mpi=pmix, nftables, iproute2).
#
# Runs only as root and only installs what is missing; a non-root contributor gets a message
# and the launcher tests skip with a reason (in CI, where CI=true, they fail instead).
set -euo pipefail

PACKAGES=(slurm-wlm slurmd slurmctld slurm-client munge openmpi-bin libopenmpi-dev mpich
          libpmix-dev nftables iproute2 procps faketime)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-system-deps: not root; missing ${missing[*]}: launcher tests will be skipped" >&2
    exit 0
fi
echo "install-system-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
