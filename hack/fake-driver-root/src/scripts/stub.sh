# --- a fake driver program that only records its call ---
fake_record_call "$@"
if [ -n "$FAKE_STUB_MESSAGE" ]; then
    printf '%s\n' "$FAKE_STUB_MESSAGE" >&2
fi
exit "$FAKE_STUB_EXIT"
