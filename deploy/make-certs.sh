#!/usr/bin/env bash
# make-certs.sh: the certificates and MQTT credentials of a linkguard bus (Mosquitto with TLS,
# one user per GPU host; deploy/mosquitto/).
#
# Usage:
#   deploy/make-certs.sh -o OUTDIR [-b BROKER_NAME]... [-f HOSTS_FILE] [-c] [-d DAYS]
#                        [-s SERVICE_USER] [-p OPERATOR_USER] [HOST...]
#
#   -o OUTDIR        where everything goes (created, mode 0700); required
#   -b BROKER_NAME   a name agents use to reach the broker (DNS name or IP address), put in
#                    the broker certificate's subjectAltName next to localhost and 127.0.0.1;
#                    repeatable (e.g. -b mqtt.mgmt.example -b 10.0.0.5); a DNS name is
#                    dot-separated labels of letters, digits and '-' (1-63 each, no '-' first
#                    or last; 253 at most), an IPv4 address four numbers 0-255, an IPv6
#                    address hex digits and ':'; anything else is refused
#   -f HOSTS_FILE    GPU host names, one a line (blank lines and # comments ignored); each is
#                    also the host's MQTT user name and must equal the agent's `host` setting
#   -c               also make a client certificate per user (CN = user name), for brokers
#                    that require one (deploy/mosquitto/mosquitto.conf: require_certificate)
#   -d DAYS          validity of new certificates (default 825; the CA gets 10 years)
#   -s NAME          the topology service's user (default linkguard-topology)
#   -p NAME          the operator's user, who may set fabric faults (default linkguard-operator)
#   HOST...          more GPU host names
#
# Makes, in OUTDIR (keys and passwords 0600, certificates 0644):
#   ca.crt ca.key              the bus CA (EC P-256); ca.crt goes to every agent (bus.ca_file)
#   broker.crt broker.key      the broker's certificate (serverAuth), signed by the CA
#   users/<user>.password      one random password (192 bits, hex) per user: the agent's
#                              bus.password_file
#   users/<user>.crt .key      with -c: the user's client certificate (clientAuth)
#   passwd.plain               "user:password" lines, the input of `mosquitto_passwd -U`
#   passwd                     the same, hashed by `mosquitto_passwd -U` (when installed):
#                              the broker's password_file
#
# Idempotent: what exists is kept (CA, keys, passwords, client certificates), so a second run
# with more hosts adds only theirs; the broker certificate is re-issued (same key) when its
# names change; passwd.plain and passwd are rewritten from users/*.password every run. Delete
# a file to renew it; delete users/<host>.* and run again to revoke a host (then reload the
# broker: `systemctl reload mosquitto`, SIGHUP re-reads password_file and acl_file).
# Host names: letters, digits, '.', '_', '-' (they are MQTT topic levels in the ACL).
# Needs: bash, openssl (1.1.1 or 3.x); mosquitto_passwd for the hashed file.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
die() { echo "make-certs.sh: $*" >&2; exit 2; }

out="" days=825 client_certs=0 service_user=linkguard-topology operator_user=linkguard-operator
brokers=() hosts=()
while getopts ":o:b:f:cd:s:p:h" opt; do
    case "$opt" in
        o) out=$OPTARG ;;
        b) brokers+=("$OPTARG") ;;
        f) [[ -r $OPTARG ]] || die "cannot read the hosts file $OPTARG"
           while IFS= read -r line || [[ -n $line ]]; do
               line=${line%%#*}
               line=${line//[[:space:]]/}
               [[ -n $line ]] && hosts+=("$line")
           done <"$OPTARG" ;;
        c) client_certs=1 ;;
        d) [[ $OPTARG =~ ^[1-9][0-9]*$ ]] || die "-d needs a number of days, not $OPTARG"
           days=$OPTARG ;;
        s) service_user=$OPTARG ;;
        p) operator_user=$OPTARG ;;
        h) usage; exit 0 ;;
        :) die "-$OPTARG needs a value (see -h)" ;;
        *) die "unknown option -$OPTARG (see -h)" ;;
    esac
done
shift $((OPTIND - 1))
hosts+=("$@")
[[ -n $out ]] || die "give the output directory: -o OUTDIR (see -h)"
command -v openssl >/dev/null || die "openssl not found (Debian package openssl)"

# A user name is a topic level in the ACL (%u): the agent's host-name rule (linkguard.models).
name_ok='^[A-Za-z0-9][A-Za-z0-9_.-]{0,252}$'
users=("$service_user" "$operator_user")
for h in "${hosts[@]}"; do
    [[ $h =~ $name_ok ]] || die "host name '$h': use letters, digits, '.', '_' or '-'"
    [[ $h != "$service_user" && $h != "$operator_user" ]] ||
        die "host name '$h' is taken by the service or operator user"
    users+=("$h")
done
for u in "$service_user" "$operator_user"; do
    [[ $u =~ $name_ok ]] || die "user name '$u': use letters, digits, '.', '_' or '-'"
done
# A broker name goes into the certificate's subjectAltName as an IP address or a DNS name
# (RFC 1123 host name labels; RFC 5280 4.2.1.6), and it must be what bus.host says.
octet='(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])'
ipv4="^$octet(\.$octet){3}\$"
label='[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?'
dns="^$label(\.$label)*\$"
for b in "${brokers[@]}"; do
    if [[ $b == *:* ]]; then # IPv6: hex groups and colons (an IPv4 tail allowed), one '::'
        colons=${b//[^:]/}
        rest=${b#*::}
        [[ $b =~ ^[0-9A-Fa-f:.]+$ && ${#colons} -ge 2 && ${#colons} -le 7 &&
            $rest != *::* ]] ||
            die "broker name '$b' is not an IPv6 address (hex groups separated by ':')"
    elif [[ $b =~ ^[0-9.]+$ ]]; then
        [[ $b =~ $ipv4 ]] || die "broker name '$b' is not an IPv4 address (four numbers 0-255)"
    elif ! [[ $b =~ $dns && ${#b} -le 253 ]]; then
        die "broker name '$b' is not a DNS name: dot-separated labels of letters, digits" \
            "and '-' (1-63 characters each, not starting or ending with '-'), 253 at most"
    fi
done
# de-duplicate, keeping the first occurrence
declare -A seen=()
unique=()
for u in "${users[@]}"; do
    if [[ -z ${seen[$u]:-} ]]; then
        unique+=("$u")
        seen[$u]=1
    fi
done
users=("${unique[@]}")

umask 077 # every file is private unless chmod'ed below
mkdir -p "$out/users"
chmod 0700 "$out" "$out/users"
cd "$out"
work=$(mktemp -d)
trap 'rm -rf "$work" passwd.tmp' EXIT

new_key() { # new_key FILE: an EC P-256 private key, mode 0600, unless FILE exists
    [[ -s $1 ]] || openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"
    chmod 0600 "$1"
}

issue() { # issue KEY CN CRT EXTENSIONS...: a certificate for KEY, signed by the CA
    local key=$1 cn=$2 crt=$3 err
    shift 3
    printf '%s\n' "basicConstraints=critical,CA:FALSE" "$@" >"$work/ext"
    openssl req -new -key "$key" -out "$work/csr" -subj "/CN=$cn"
    # OpenSSL 3 reports success on stderr too: show it only when signing fails
    if ! err=$(openssl x509 -req -in "$work/csr" -CA ca.crt -CAkey ca.key -out "$crt.new" \
        -days "$days" -set_serial "0x$(openssl rand -hex 16)" -extfile "$work/ext" 2>&1); then
        echo "$err" >&2
        exit 1
    fi
    chmod 0644 "$crt.new"
    mv -f "$crt.new" "$crt"
}

# 1. The CA: signs the broker's and the clients' certificates.
new_key ca.key
if [[ ! -s ca.crt ]]; then
    openssl req -new -x509 -key ca.key -out ca.crt -days 3650 -subj "/CN=linkguard bus CA" \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
        -addext "keyUsage=critical,keyCertSign,cRLSign"
    echo "made the CA: $out/ca.crt"
fi
chmod 0644 ca.crt

# 2. The broker: its names are what agents connect to (TLS checks the name).
san="DNS:localhost,IP:127.0.0.1"
for b in "${brokers[@]}"; do
    if [[ $b =~ ^[0-9.]+$ || $b == *:* ]]; then san+=",IP:$b"; else san+=",DNS:$b"; fi
done
new_key broker.key
if [[ ! -s broker.crt || ! -s broker.san || $(cat broker.san) != "$san" ]]; then
    issue broker.key "${brokers[0]:-localhost}" broker.crt \
        "keyUsage=critical,digitalSignature,keyEncipherment" \
        "extendedKeyUsage=serverAuth" "subjectAltName=$san"
    printf '%s' "$san" >broker.san
    chmod 0644 broker.san
    echo "made the broker certificate for $san: $out/broker.crt"
fi

# 3. One credential per user: a password, and with -c a client certificate.
for u in "${users[@]}"; do
    if [[ ! -s users/$u.password ]]; then
        openssl rand -hex 24 >"users/$u.password"
        echo "made a password for $u: $out/users/$u.password"
    fi
    chmod 0600 "users/$u.password"
    if ((client_certs)); then
        new_key "users/$u.key"
        if [[ ! -s users/$u.crt ]]; then
            issue "users/$u.key" "$u" "users/$u.crt" \
                "keyUsage=critical,digitalSignature" "extendedKeyUsage=clientAuth"
            echo "made a client certificate for $u: $out/users/$u.crt"
        fi
    fi
done

# 4. The broker's password file, from every users/*.password (also users of earlier runs).
for f in users/*.password; do
    printf '%s:%s\n' "$(basename "$f" .password)" "$(head -n 1 "$f")"
done | sort >passwd.tmp
mv -f passwd.tmp passwd.plain
chmod 0600 passwd.plain
if command -v mosquitto_passwd >/dev/null; then
    cp passwd.plain passwd.tmp
    mosquitto_passwd -U passwd.tmp
    mv -f passwd.tmp passwd
    chmod 0600 passwd
    echo "wrote $out/passwd ($(wc -l <passwd) users, hashed)"
else
    echo "mosquitto_passwd not found: hash $out/passwd.plain on the broker with" \
        "'cp passwd.plain passwd && mosquitto_passwd -U passwd'" >&2
fi
