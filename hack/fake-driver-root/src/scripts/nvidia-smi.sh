# --- fake nvidia-smi: records the call, keeps per-GPU settings in a state file ---
fake_record_call "$@"

if [ "$FAKE_SMI_FAIL_CODE" -ne 0 ]; then
    printf '%s\n' "$FAKE_SMI_FAIL_MESSAGE" >&2
    exit "$FAKE_SMI_FAIL_CODE"
fi

smi_state="$FAKE_STATE_DIR/gpu-state"

smi_usage() {
    printf '%s\n' "$1" >&2
    printf '%s\n' "Please run 'nvidia-smi -h' for help." >&2
    exit 2
}

# The GPU named by -i: a UUID the fake knows, or exit like nvidia-smi does.
smi_gpu() {
    if ! fake_valid_id "$1"; then
        smi_usage "Invalid device id: $1"
    fi
    if ! fake_known_gpu "$1"; then
        printf '%s\n' "No devices were found" >&2
        exit 6
    fi
}

smi_save() {
    mkdir -p "$FAKE_STATE_DIR" && printf '%s %s %s\n' "$1" "$2" "$3" >>"$smi_state"
}

case ${1-} in
'')
    printf '%s\n' "NVIDIA-SMI (fake)    Driver Version: $FAKE_DRIVER_VERSION    CUDA Version: 12.8"
    for g in $FAKE_GPUS; do
        printf '%s\n' "| $g | Fake GPU |"
    done
    exit 0
    ;;
-L | --list-gpus)
    i=0
    for g in $FAKE_GPUS; do
        printf '%s\n' "GPU $i: Fake GPU (UUID: $g)"
        i=$((i + 1))
    done
    exit 0
    ;;
compute-policy)
    shift
    uuid=''
    slice=''
    while [ $# -gt 0 ]; do
        case $1 in
        -i | --id)
            [ $# -ge 2 ] || smi_usage "Missing value for $1"
            uuid=$2
            shift 2
            ;;
        --id=*)
            uuid=${1#--id=}
            shift
            ;;
        --set-timeslice)
            [ $# -ge 2 ] || smi_usage "Missing value for $1"
            slice=$2
            shift 2
            ;;
        --set-timeslice=*)
            slice=${1#--set-timeslice=}
            shift
            ;;
        *) smi_usage "Invalid combination of input arguments: $1" ;;
        esac
    done
    [ -n "$uuid" ] || smi_usage "compute-policy needs -i <GPU>"
    smi_gpu "$uuid"
    case $slice in
    0 | 1 | 2 | 3) ;;
    *) smi_usage "Invalid timeslice value: $slice (0 to 3)" ;;
    esac
    smi_save timeslice "$uuid" "$slice" || exit 1
    printf '%s\n' "Set timeslice to $slice for GPU $uuid."
    exit 0
    ;;
esac

# `nvidia-smi -i <GPU> -c <MODE>`
uuid=''
mode=''
while [ $# -gt 0 ]; do
    case $1 in
    -i | --id)
        [ $# -ge 2 ] || smi_usage "Missing value for $1"
        uuid=$2
        shift 2
        ;;
    -c | --compute-mode)
        [ $# -ge 2 ] || smi_usage "Missing value for $1"
        mode=$2
        shift 2
        ;;
    *) smi_usage "Invalid combination of input arguments: $1" ;;
    esac
done
if [ -z "$mode" ]; then
    smi_usage "Nothing to do (the fake knows -L, compute-policy and -i <GPU> -c <MODE>)"
fi
[ -n "$uuid" ] || smi_usage "-c needs -i <GPU> in the fake"
smi_gpu "$uuid"
case $mode in
0 | DEFAULT) mode=DEFAULT ;;
2 | PROHIBITED) mode=PROHIBITED ;;
3 | EXCLUSIVE_PROCESS) mode=EXCLUSIVE_PROCESS ;;
*) smi_usage "Invalid compute mode: $mode" ;;
esac
smi_save compute_mode "$uuid" "$mode" || exit 1
printf '%s\n' "Compute mode set to $mode for GPU $uuid."
exit 0
