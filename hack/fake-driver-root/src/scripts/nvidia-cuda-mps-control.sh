# --- fake nvidia-cuda-mps-control ---
# `-d` daemonizes (setsid, survives its parent) a control daemon that keeps
# its state in CUDA_MPS_PIPE_DIRECTORY and logs to
# CUDA_MPS_LOG_DIRECTORY/control.log; without arguments it is the client: it
# sends each stdin line to the daemon found through CUDA_MPS_PIPE_DIRECTORY
# and prints the answer. The real daemon listens on a UNIX socket
# `<pipe>/control`; sh has none, so the fake's `control` is a FIFO carrying
# `<client pid> <command>` lines, answered through the client's own FIFO
# `<pipe>/.reply.<pid>` (status line, output lines, an end line).
#
# Like the real programs, the hot paths start no other program where sh can
# do the work itself: a real daemon answers a command without forking, and
# the stand-in's cost should not drown what the plugin around it costs.
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
    { read -r dst <"/proc/$dp/stat"; } 2>/dev/null || return 1
    dst=${dst##*\) }
    case $dst in
    Z* | X*) return 1 ;;
    esac
    printf '%s\n' "$dp"
}

# The time for the log lines that follow (one `date` per request, not per line).
mps_now() {
    NOW=$(date '+%Y-%m-%d %H:%M:%S')
}

mps_log() {
    printf '[%s.000 Control %5d] %s\n' "$NOW" "$DPID" "$1" >>"$LOGD/control.log"
}

# Removes those of the files that exist, with one `rm` at most (`rm` is a
# program; most of the time there is nothing to remove).
rm_present() {
    for rp_f; do
        shift
        if [ -e "$rp_f" ] || [ -L "$rp_f" ]; then
            set -- "$@" "$rp_f"
        fi
    done
    if [ $# -gt 0 ]; then
        rm -f "$@"
    fi
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
    rm_present "$FIFO" "$FIFO.new"
    fake_sleep_ms "$FAKE_MPS_START_DELAY_MS"
    # One short write: a reader sees no file, an empty one or the whole pid.
    printf '%s\n' "$DPID" >"$PIDF" || exit 1
    mps_now
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
    trap 'rm_present "$FIFO" "$PIDF"; exit 0' TERM INT
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
        mps_now
        mps_log "Accepting connection..."
        mps_log "NEW UI"
        mps_log "Cmd:$cmd"
        # Behaviour changes reach a running daemon from its next command.
        if [ -r "$FAKE_CONF" ]; then
            . "$FAKE_CONF"
        fi
        fake_sleep_ms "$FAKE_MPS_REPLY_DELAY_MS"
        handle "$cmd"
        fake_record mps-command "$PIPE" "$cmd" "$st"
        # The client made and holds its reply FIFO; opened read-write, the
        # open never blocks, even for a client that is gone. (No FIFO: a
        # forged or abandoned request, nobody to answer.)
        rf="$PIPE/.reply.$cpid"
        if [ -p "$rf" ]; then
            printf '%s\n%s\n%s\n' "$st" "$out" "$REPLY_END" 2>/dev/null 1<>"$rf" || :
        fi
        mps_log "UI closed"
        if [ "$quitting" = 1 ]; then
            mps_log "Exit"
            rm_present "$FIFO" "$PIDF" "$STATE"
            exit 0
        fi
    done
}

# --- client side ---
# The line that ends a reply (output lines are never this).
REPLY_END='--- end of reply ---'

# Runs in the background while a client waits: answers for the daemon when it
# died (`X`) or took longer than the behaviour's reply timeout (`T`). Its
# first check comes after 50 ms; most replies come well before, and then it is
# killed unseen.
reply_watch() {
    rw_waited=0
    while :; do
        sleep 0.05
        rw_waited=$((rw_waited + 50))
        if ! daemon_pid >/dev/null; then
            printf 'X\n' 1<>"$rf"
            exit 0
        fi
        if [ "$rw_waited" -ge "$FAKE_MPS_REPLY_TIMEOUT_MS" ]; then
            printf 'T\n' 1<>"$rf"
            exit 0
        fi
    done
}

run_client() {
    rc=0
    rf="$PIPE/.reply.$$"
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
        # The reply FIFO is held open (read-write, so the open does not
        # block) before the request goes out: nothing the daemon writes is lost.
        rm_present "$rf"
        mkfifo -m 600 "$rf" || exit 1
        exec 5<>"$rf"
        reply_watch </dev/null >/dev/null 2>&1 &
        watcher=$!
        exec 4<>"$FIFO"
        printf '%s %s\n' "$$" "$line" >&4
        exec 4>&-
        read -r st <&5
        case $st in
        X)
            kill "$watcher" 2>/dev/null
            printf '%s\n' "MPS control daemon exited before answering" >&2
            rm_present "$rf"
            exit 1
            ;;
        T)
            printf '%s\n' "Timed out waiting for the MPS control daemon" >&2
            rm_present "$rf"
            exit 1
            ;;
        esac
        kill "$watcher" 2>/dev/null
        while IFS= read -r reply <&5; do
            [ "$reply" != "$REPLY_END" ] || break
            [ -z "$reply" ] || printf '%s\n' "$reply"
        done
        exec 5<&-
        rm_present "$rf"
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
    if [ ! -d "$PIPE" ] || [ ! -d "$LOGD" ]; then
        mkdir -p "$PIPE" "$LOGD" || exit 1
    fi
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
