# --- fake nvidia-cuda-mps-control ---
# `-d` daemonizes (setsid, survives its parent) a control daemon that keeps
# its state in CUDA_MPS_PIPE_DIRECTORY and logs to
# CUDA_MPS_LOG_DIRECTORY/control.log; without arguments it is the client: it
# sends each stdin line to the daemon found through CUDA_MPS_PIPE_DIRECTORY
# and prints the answer. The real daemon listens on a UNIX socket
# `<pipe>/control`; sh has none, so the fake's `control` is a FIFO carrying
# `<client pid> <command>` lines, answered through `<pipe>/.reply.<pid>`.
fake_record_call "$@"

PIPE=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
LOGD=${CUDA_MPS_LOG_DIRECTORY:-/var/log/nvidia-mps}
PIDF="$PIPE/nvidia-cuda-mps-control.pid"
FIFO="$PIPE/control"
STATE="$PIPE/fake-mps-state"

# The pid of a live (not zombie) daemon of this pipe directory, printed.
daemon_pid() {
    [ -r "$PIDF" ] || return 1
    read -r dp <"$PIDF" || return 1
    fake_digits "$dp" || return 1
    dst=$(cat "/proc/$dp/stat" 2>/dev/null) || return 1
    dst=${dst##*\) }
    case $dst in
    Z* | X*) return 1 ;;
    esac
    printf '%s\n' "$dp"
}

mps_log() {
    printf '[%s.000 Control %5d] %s\n' "$(date '+%Y-%m-%d %H:%M:%S')" "$DPID" "$1" >>"$LOGD/control.log"
}

# --- daemon side ---
valid_pct() {
    case $1 in
    '' | *[!0-9.]* | *.*.*) return 1 ;;
    esac
    dint=${1%%.*}
    [ -n "$dint" ] && [ "$dint" -le 100 ]
}

valid_limit() {
    case $1 in
    *M | *G) fake_digits "${1%?}" ;;
    *) return 1 ;;
    esac
}

# The last value stored for key $1 (and device $2) in the state file.
state_get() {
    sg_out=''
    while read -r sk sd sv; do
        if [ "$sk" = "$1" ] && [ "$sd" = "$2" ]; then
            sg_out=$sv
        fi
    done <"$STATE"
    printf '%s' "$sg_out"
}

# Runs one command; sets `st` (0 ok, 1 error) and `out`.
handle() {
    st=0
    out=''
    set -f
    # shellcheck disable=SC2086
    set -- $1
    set +f
    if [ -n "$FAKE_MPS_REFUSE" ] && [ "${1-}" = "$FAKE_MPS_REFUSE" ]; then
        st=1
        out="Command refused (fake driver behaviour): $1"
        return
    fi
    case ${1-} in
    get_server_list)
        [ $# -eq 1 ] || { st=1; out='usage: get_server_list'; }
        ;;
    get_default_active_thread_percentage)
        out=$(state_get active_thread_percentage -)
        [ -n "$out" ] || out='100.0'
        ;;
    set_default_active_thread_percentage)
        if [ $# -eq 2 ] && valid_pct "$2"; then
            printf '%s %s %s\n' active_thread_percentage - "$2" >>"$STATE"
            out=$2
        else
            st=1
            out='Invalid value: the percentage must be a number from 0 to 100'
        fi
        ;;
    get_default_device_pinned_mem_limit)
        if [ $# -eq 2 ] && fake_valid_id "$2"; then
            out=$(state_get pinned_mem_limit "$2")
        else
            st=1
            out='usage: get_default_device_pinned_mem_limit <dev>'
        fi
        ;;
    set_default_device_pinned_mem_limit)
        if [ $# -eq 3 ] && fake_valid_id "$2" && valid_limit "$3"; then
            printf '%s %s %s\n' pinned_mem_limit "$2" "$3" >>"$STATE"
        else
            st=1
            out='Invalid arguments: set_default_device_pinned_mem_limit <dev> <N>M|<N>G'
        fi
        ;;
    quit)
        if [ $# -eq 1 ] || { [ $# -eq 3 ] && [ "$2" = -t ] && fake_digits "$3"; }; then
            quitting=1
        else
            st=1
            out='usage: quit [-t <seconds>]'
        fi
        ;;
    *)
        st=1
        out="Unknown command: ${1-}"
        ;;
    esac
}

run_daemon() {
    DPID=$$
    # A dead daemon's endpoint must not be mistaken for this one's.
    rm -f "$FIFO" "$FIFO.new"
    fake_sleep_ms "$FAKE_MPS_START_DELAY_MS"
    printf '%s\n' "$DPID" >"$PIDF.tmp" && mv -f "$PIDF.tmp" "$PIDF" || exit 1
    mps_log "Starting control daemon using socket $FIFO"
    mps_log "To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY=$PIPE"
    shm=$(stat -L -c '%d:%i' /dev/shm 2>/dev/null) || shm=unknown
    {
        printf 'daemon_pid - %s\n' "$DPID"
        printf 'dev_shm - %s\n' "$shm"
        printf 'visible_devices - %s\n' "${CUDA_VISIBLE_DEVICES-}"
    } >"$STATE"
    if [ "$FAKE_MPS_NEVER_READY" = 1 ]; then
        while :; do
            sleep 1
        done
    fi
    trap 'rm -f "$FIFO" "$PIDF"; exit 0' TERM INT
    # The FIFO is opened before it gets its name, so a client that sees
    # `control` never writes into a FIFO nobody holds (data written into a
    # FIFO without a reader is lost when the writer closes it). Read-write:
    # the open never blocks, and the daemon's own write end keeps the FIFO
    # from reporting end-of-file between clients.
    mkfifo "$FIFO.new" || exit 1
    exec 3<>"$FIFO.new"
    mv -f "$FIFO.new" "$FIFO" || exit 1
    quitting=0
    while read -r cpid cmd <&3; do
        if ! fake_digits "$cpid"; then
            mps_log "Invalid request ignored"
            continue
        fi
        mps_log "Accepting connection..."
        mps_log "NEW UI"
        mps_log "Cmd:$cmd"
        # Behaviour changes reach a running daemon from its next command.
        if [ -r "$FAKE_CONF" ]; then
            . "$FAKE_CONF"
        fi
        handle "$cmd"
        fake_record mps-command "$PIPE" "$cmd" "$st"
        rf="$PIPE/.reply.$cpid"
        printf '%s\n%s\n' "$st" "$out" >"$rf.tmp" && mv -f "$rf.tmp" "$rf"
        mps_log "UI closed"
        if [ "$quitting" = 1 ]; then
            mps_log "Exit"
            rm -f "$FIFO" "$PIDF" "$STATE"
            exit 0
        fi
    done
}

# --- client side ---
run_client() {
    rc=0
    while IFS= read -r line || [ -n "$line" ]; do
        [ -n "$line" ] || continue
        if ! daemon_pid >/dev/null || [ ! -p "$FIFO" ]; then
            printf '%s\n' "Cannot find MPS control daemon process" >&2
            exit 1
        fi
        if [ ${#line} -gt 1000 ]; then
            printf '%s\n' "Command too long" >&2
            rc=1
            continue
        fi
        rf="$PIPE/.reply.$$"
        rm -f "$rf"
        exec 4<>"$FIFO"
        printf '%s %s\n' "$$" "$line" >&4
        exec 4>&-
        waited=0
        while [ ! -e "$rf" ]; do
            # (The reply is checked again: `quit` answers, then exits.)
            if ! daemon_pid >/dev/null && [ ! -e "$rf" ]; then
                printf '%s\n' "MPS control daemon exited before answering" >&2
                exit 1
            fi
            if [ "$waited" -ge "$FAKE_MPS_REPLY_TIMEOUT_MS" ]; then
                printf '%s\n' "Timed out waiting for the MPS control daemon" >&2
                exit 1
            fi
            sleep 0.005
            waited=$((waited + 5))
        done
        {
            read -r st
            while IFS= read -r reply; do
                [ -z "$reply" ] || printf '%s\n' "$reply"
            done
        } <"$rf"
        rm -f "$rf"
        [ "$st" = 0 ] || rc=1
    done
    exit "$rc"
}

case ${1-} in
-d)
    if [ -n "$FAKE_MPS_START_FAIL" ]; then
        printf '%s\n' "$FAKE_MPS_START_FAIL" >&2
        exit 1
    fi
    if daemon_pid >/dev/null; then
        printf '%s\n' "An instance of this daemon is already running" >&2
        exit 1
    fi
    mkdir -p "$PIPE" "$LOGD" || exit 1
    if command -v setsid >/dev/null 2>&1; then
        setsid "$0" --fake-daemon </dev/null >/dev/null 2>&1 &
    else
        (
            trap '' HUP
            exec "$0" --fake-daemon
        ) </dev/null >/dev/null 2>&1 &
    fi
    exit 0
    ;;
--fake-daemon)
    run_daemon
    ;;
'')
    run_client
    ;;
*)
    printf '%s\n' "usage: nvidia-cuda-mps-control [-d]" >&2
    exit 1
    ;;
esac
