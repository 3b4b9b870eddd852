# Phases of scripts/test.sh and the timing summary printed at its end
# (sourced, not run). Each phase's wall time and result go to
# $PHASES_DIR/phases.tsv; a phase run in the background writes its output to
# $PHASES_DIR/NAME.log, printed whole when the phase is waited for.
#
#   phase NAME CMD...        run CMD now; its status is the phase's
#   phase_bg NAME CMD...     start CMD in the background
#   phase_wait NAME...       wait for background phases; fails if one failed
#   phases_summary           the summary (the EXIT trap calls it)

PHASES_DIR="${PHASES_DIR:-target/test-run}"
PHASES_START=$(date +%s)
declare -A PHASE_PID=() PHASE_T0=()

_phase_record() { # NAME START STATUS
	printf '%s\t%s\t%s\t%s\n' "$1" "$(($2 - PHASES_START))" "$(($(date +%s) - $2))" "$3" >>"$PHASES_DIR/phases.tsv"
}

phases_init() {
	rm -rf "$PHASES_DIR" target/nextest/*/junit.xml
	mkdir -p "$PHASES_DIR"
	: >"$PHASES_DIR/phases.tsv"
	echo "load at start: $(uptime)" >"$PHASES_DIR/load"
}

phase() {
	local name=$1 t0 status=0
	shift
	t0=$(date +%s)
	echo "==> $name: $*" >&2
	"$@" || status=$?
	_phase_record "$name" "$t0" "$status"
	return "$status"
}

phase_bg() {
	local name=$1
	shift
	echo "==> $name (in the background, $PHASES_DIR/$name.log): $*" >&2
	PHASE_T0[$name]=$(date +%s)
	(
		status=0
		"$@" || status=$?
		_phase_record "$name" "${PHASE_T0[$name]}" "$status"
		exit "$status"
	) >"$PHASES_DIR/$name.log" 2>&1 &
	PHASE_PID[$name]=$!
}

phase_wait() {
	local name status failed=0
	for name in "$@"; do
		status=0
		wait "${PHASE_PID[$name]}" || status=$?
		unset 'PHASE_PID[$name]'
		echo "==> $name (background) ended with status $status; its output:" >&2
		cat "$PHASES_DIR/$name.log" >&2
		[ "$status" -eq 0 ] || failed=1
	done
	return "$failed"
}

# The slowest tests in nextest's JUnit reports: "seconds  binary  test".
_slowest_tests() {
	local junit
	for junit in target/nextest/*/junit.xml; do
		[ -f "$junit" ] || continue
		local profile
		profile=$(basename "$(dirname "$junit")")
		grep -o '<testcase [^>]*>' "$junit" |
			sed -n 's/.*name="\([^"]*\)".*classname="\([^"]*\)".*time="\([^"]*\)".*/\3\t\2\t\1/p' |
			awk -F'\t' -v p="$profile" '{ printf "%8.1f s  %s%s  %s\n", $1, $2, (p == "default" ? "" : " [" p "]"), $3 }'
	done | sort -rn | awk -v n="${1:-10}" 'NR <= n'
	# (awk reads to the end: `head` would close the pipe early, and sort's
	# SIGPIPE under pipefail ended the summary, and the run, with 141.)
}

# Tests run by nextest, from its JUnit reports' totals.
_nextest_counts() {
	cat target/nextest/*/junit.xml 2>/dev/null | grep -o '<testsuites [^>]*>' |
		sed -n 's/.* tests="\([0-9]*\)".* failures="\([0-9]*\)" errors="\([0-9]*\)".*/\1 \2 \3/p' |
		awk '{ t += $1; f += $2 + $3 } END { if (NR) printf "nextest: %d passed, %d failed\n", t - f, f }'
}

phases_summary() {
	local status=$? name
	# Background phases still running when the script stops (a failure
	# before they were waited for) are stopped, and shown as such.
	for name in "${!PHASE_PID[@]}"; do
		kill -- "${PHASE_PID[$name]}" 2>/dev/null || true
		wait "${PHASE_PID[$name]}" 2>/dev/null || true
		_phase_record "$name" "${PHASE_T0[$name]}" stopped
	done
	{
		echo
		echo "=== timing summary ($(date -u +%Y-%m-%dT%H:%MZ), exit status $status) ==="
		printf '%-22s %8s %8s  %s\n' phase "start s" "wall s" result
		while IFS=$'\t' read -r name start wall result; do
			case $result in 0) result=ok ;; stopped) ;; *) result="FAILED ($result)" ;; esac
			printf '%-22s %8s %8s  %s\n' "$name" "$start" "$wall" "$result"
		done <"$PHASES_DIR/phases.tsv"
		printf '%-22s %8s %8s\n' total 0 "$(($(date +%s) - PHASES_START))"
		local slowest
		slowest=$(_slowest_tests 10)
		if [ -n "$slowest" ]; then
			echo "slowest tests (nextest JUnit, target/nextest/*/junit.xml):"
			echo "$slowest"
		fi
		# The errors of background phases, whose whole logs scroll far
		# above: the first lines that name one, per log.
		local log errors
		for log in "$PHASES_DIR"/*.log; do
			[ -f "$log" ] || continue
			errors=$(grep -E '^(error|warning: build failed)|panicked at|^ +FAIL ' "$log" | awk 'NR <= 12' || true)
			if [ -n "$errors" ]; then
				echo "errors in $log:"
				echo "$errors"
			fi
		done
		cat "$PHASES_DIR/load"
		echo "load at end:   $(uptime)"
		echo "disk: $(du -sh target 2>/dev/null | cut -f1) in target/"
		_nextest_counts
	} >&2
	return "$status"
}
