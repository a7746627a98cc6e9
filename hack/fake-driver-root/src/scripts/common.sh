# --- common part of every fake driver program (POSIX sh; dash and busybox ash) ---
# FAKE_ROOT and FAKE_TOOL are set above this part by the generator.
LC_ALL=C
export LC_ALL
FAKE_LOG="$FAKE_ROOT/var/log/fake-driver/calls.log"
FAKE_STATE_DIR="$FAKE_ROOT/var/lib/fake-driver"
FAKE_CONF="$FAKE_ROOT/etc/fake-driver/behaviour.conf"

# Behaviour defaults; the crate overwrites them through $FAKE_CONF.
FAKE_GPUS=''
FAKE_SMI_FAIL_CODE=0
FAKE_SMI_FAIL_MESSAGE=''
FAKE_MPS_START_FAIL=''
FAKE_MPS_START_DELAY_MS=0
FAKE_MPS_NEVER_READY=0
FAKE_MPS_REFUSE=''
FAKE_MPS_REPLY_TIMEOUT_MS=5000
FAKE_MPS_REPLY_DELAY_MS=0
if [ -r "$FAKE_CONF" ]; then
    . "$FAKE_CONF"
fi

# One record: NUL-terminated fields `REC`, kind, field count, fields. A single
# printf is a single write, so concurrent programs do not interleave records.
fake_record() {
    fake_kind=$1
    shift
    printf '%s\0' REC "$fake_kind" "$#" "$@" >>"$FAKE_LOG" 2>/dev/null || :
}

# Records this invocation: tool, argc, argv, then the relevant environment
# (`NAME=value`, or `NAME` alone when unset).
fake_record_call() {
    fake_n=$#
    set -- "$FAKE_TOOL" "$fake_n" "$@"
    for fake_v in CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; do
        eval "fake_isset=\${$fake_v+x}"
        if [ -n "$fake_isset" ]; then
            eval "set -- \"\$@\" \"$fake_v=\${$fake_v}\""
        else
            set -- "$@" "$fake_v"
        fi
    done
    fake_record call "$@"
}

# A device id the fakes accept: a UUID-like word, no path or shell specials.
fake_valid_id() {
    case $1 in
    '' | *[!A-Za-z0-9-]*) return 1 ;;
    esac
    return 0
}

# Whether nvidia-smi knows this GPU (any GPU when no list is configured).
fake_known_gpu() {
    if [ -z "$FAKE_GPUS" ]; then
        return 0
    fi
    for fake_g in $FAKE_GPUS; do
        if [ "$fake_g" = "$1" ]; then
            return 0
        fi
    done
    return 1
}

fake_digits() {
    case $1 in
    '' | *[!0-9]*) return 1 ;;
    esac
    return 0
}

# Sleeps N milliseconds (GNU and busybox sleep take fractions).
fake_sleep_ms() {
    if [ "$1" -gt 0 ]; then
        sleep "$(($1 / 1000)).$(printf '%03d' $(($1 % 1000)))"
    fi
}
# --- end of common part ---
