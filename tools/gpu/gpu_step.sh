# tools/gpu/gpu_step.sh — sourced by tools/gpu/gpu_check.sh and tools/gpu/gpu_ab.sh (a lent GPU
# machine's checks): one budgeted step of such a check.
#
# step NAME CAP_S MIN_S COMMAND...: runs COMMAND with its output in $LOGS/NAME.log under
# `timeout` of its cap or what is left of the check's budget ($BUDGET seconds from
# $START, less $STEP_RESERVE_S for the summary), whichever is less; with under MIN_S
# left it does not start: RESULT[NAME]=no_time and status 1. Otherwise RESULT[NAME] is
# pass / timeout / fail, SECS[NAME] its seconds, and a failure's log tail goes to
# stderr. NAME is appended to ORDER. The caller declares RESULT and SECS (associative),
# ORDER, LOGS, BUDGET, START and log().
STEP_RESERVE_S="${STEP_RESERVE_S:-8}"
step() {
  local name=$1 cap=$2 min=$3; shift 3
  ORDER+=("$name")
  local limit=$cap
  if [ "$BUDGET" -gt 0 ]; then
    local left=$(( BUDGET - ($(date +%s) - START) - STEP_RESERVE_S ))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt "$min" ]; then RESULT[$name]=no_time; log "$name: skipped, ${left}s left of the budget"; return 1; fi
  fi
  log "$name (<= ${limit}s)"
  local t0 rc
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  SECS[$name]=$(( $(date +%s) - t0 ))
  case $rc in
    0) RESULT[$name]=pass ;;
    124|137) RESULT[$name]=timeout; log "$name: cut at ${limit}s (tail of its log):"; tail -20 "$LOGS/$name.log" >&2 ;;
    *) RESULT[$name]=fail; log "$name FAILED, exit $rc (tail of its log):"; tail -20 "$LOGS/$name.log" >&2 ;;
  esac
  return 0
}
