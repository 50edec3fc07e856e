#!/usr/bin/env bash
# A complete pgtick worker in bash + psql, using only the SQL API (docs/other-languages.md).
#
#   PGTICK_DSN=postgresql://worker@db/app examples/worker.sh
#
# It claims one run at a time (jobs.claim), heartbeats it from a background loop
# (jobs.heartbeat) and reports how it ended: jobs.complete, jobs.fail (the database
# decides about a retry from the kind's policy), or jobs.acknowledge_cancel when a
# cancellation it learned about from a heartbeat stopped the job at a checkpoint.
# It registers itself and its kinds (jobs.register_worker; jobs.worker_seen on the
# heartbeat cadence, jobs.worker_stopped when it stops), as the Python worker does, so
# `pgtick workers` shows it and `pgtick status` does not report its kinds as unserved.
# The job kinds are the shell functions named job_<kind> below.
#
# SIGTERM / SIGINT: claim nothing more, give the running job PGTICK_GRACE seconds to
# finish and report it, then exit 0. A job still running after that is killed and its
# run left to the reaper (HeartbeatLost, retried by policy). A second signal exits at once.
#
# The login needs only the jobs_worker role. For concurrency, run several copies.
# Each copy claims with a claim token, a secret it draws at start: the runs it claims can
# be heartbeated and reported only with that token, not by whoever reads its worker id.
# Payloads and results travel as shell variables and psql arguments, which Linux caps at
# 128 kB each: keep them smaller (pass a reference, such as a URL or a row id, instead).
#
# Settings (environment):
#   PGTICK_DSN or DATABASE_URL   where the jobs schema lives (a URL or "host=... dbname=...")
#   PGTICK_QUEUE                 claim only from this queue (default: every queue)
#   PGTICK_POLL=1                seconds between claims while the queue is empty
#   PGTICK_HEARTBEAT=5           heartbeat cadence; keep it well under jobs.config.heartbeat_timeout
#   PGTICK_GRACE=30              seconds a running job may take to finish after SIGTERM
#   PGTICK_REPORT_TRIES=60       tries, a second apart, to report an outcome while the database is away
#   PSQL=psql                    the psql binary

set -uo pipefail # not -e: a failed psql call (a database blip) is handled, never fatal

DSN=${PGTICK_DSN:-${DATABASE_URL:-}}
if [[ -z $DSN ]]; then
    echo "worker.sh: set PGTICK_DSN or DATABASE_URL" >&2
    exit 2
fi
QUEUE=${PGTICK_QUEUE:-}
POLL=${PGTICK_POLL:-1}
HEARTBEAT=${PGTICK_HEARTBEAT:-5}
GRACE=${PGTICK_GRACE:-30}
REPORT_TRIES=${PGTICK_REPORT_TRIES:-60}
PSQL=${PSQL:-psql}
WORKER="bash-$(hostname)-$$-$(printf '%04x%04x' "$RANDOM" "$RANDOM")"
MAIN=$$
STATE=$(mktemp -d "${TMPDIR:-/tmp}/pgtick-worker.XXXXXX")
export PGAPPNAME="pgtick-bash $WORKER" PGCONNECT_TIMEOUT=${PGCONNECT_TIMEOUT:-10}
# The claim token (jobs.claim stores only its sha256). It reaches the server as a session
# setting in the connection options and the SQL reads it with current_setting: it is never
# in the text of a statement, which pg_stat_activity and statement logs show. (A DSN that
# sets options= overrides PGOPTIONS: add -c pgtick.claim_token there instead.)
TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
if ((${#TOKEN} != 32)); then
    echo "worker.sh: cannot read a claim token from /dev/urandom" >&2
    exit 2
fi
export PGOPTIONS="${PGOPTIONS:+$PGOPTIONS }-c pgtick.claim_token=$TOKEN"

log() { printf '%s worker=%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$WORKER" "$*" >&2; }

# Run the SQL on stdin. Values travel as psql variables (-v name=value) and appear in the
# SQL as :'name', which psql quotes as a literal: a payload can never become SQL.
# Output: unaligned, tuples only, tab-separated. Exit status: 0 ok, 3 the SQL failed,
# 1 or 2 psql could not talk to the server. psql ignores SIGTERM: a signal to the whole
# process group must not cut a call short whose answer (a claimed run) would then be lost.
sql() { (trap '' TERM INT && exec "$PSQL" -X -q -A -t -F $'\t' -v ON_ERROR_STOP=1 -d "$DSN" "$@"); }

# Sleep in the background so that a signal interrupts the wait at once.
pause() {
    sleep "$1" &
    local nap=$!
    wait "$nap"
    kill "$nap" 2>/dev/null
}

# ---------------------------------------------------------------------------------------
# Helpers for job code. A job runs in its own subshell with PGTICK_RUN_ID, PGTICK_KIND,
# PGTICK_ATTEMPT and PGTICK_PAYLOAD (JSON) set. It prints its result (JSON, or nothing)
# on stdout; a non-zero exit fails the run with the last stderr line as the message.
# ---------------------------------------------------------------------------------------

# payload KEY: a top-level field of the payload as text (PostgreSQL parses the JSON).
payload() {
    sql -v payload="$PGTICK_PAYLOAD" -v key="$1" <<<"SELECT :'payload'::jsonb ->> :'key'"
}

# raise CLASS MESSAGE...: fail the run with an error class the kind's retry policy
# matches on (jobs.retry_policies allow / deny), e.g. raise Unavailable "upstream is down".
raise() {
    printf '%s\n' "$1" >"$STATE/class.$PGTICK_RUN_ID"
    printf '%s\n' "${*:2}" >&2
    exit 1
}

# checkpoint: stop here if the run was cancelled or is no longer ours (both learned from
# the heartbeat answer). Call it between steps of a long job.
checkpoint() {
    if [[ -e $STATE/lost.$PGTICK_RUN_ID ]]; then
        echo "run $PGTICK_RUN_ID is no longer ours" >&2
        exit 1
    fi
    if [[ -e $STATE/cancel.$PGTICK_RUN_ID ]]; then
        echo "cancelled at a checkpoint" >&2
        exit 1
    fi
}

# json_string TEXT: TEXT as a JSON string.
json_string() {
    local s=$1
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\r'/\\r}
    s=${s//$'\t'/\\t}
    printf '"%s"' "$s"
}

# ---------------------------------------------------------------------------------------
# The job kinds: job_<kind>. Add your own; the worker claims exactly these kinds.
# ---------------------------------------------------------------------------------------

# greet {"name": "Ada"} -> {"greeting": "hello Ada"}
job_greet() {
    local name
    name=$(payload name) || raise PayloadError "cannot read the payload"
    [[ -n $name ]] || raise BadInput 'the payload needs a "name"'
    printf '{"greeting": %s}\n' "$(json_string "hello $name")"
}

# shaky {"fail_times": 2}: fails with Unavailable on the first fail_times attempts, then
# succeeds. Whether a failure is retried, how often and when is the kind's retry policy.
job_shaky() {
    local fail_times
    fail_times=$(payload fail_times) || raise PayloadError "cannot read the payload"
    if ((PGTICK_ATTEMPT <= ${fail_times:-0})); then
        raise Unavailable "upstream unavailable on attempt $PGTICK_ATTEMPT"
    fi
    printf '{"attempt": %d}\n' "$PGTICK_ATTEMPT"
}

# nap {"steps": 50}: works 0.1 s per step, checking for cancellation between steps.
job_nap() {
    local steps i
    steps=$(payload steps) || raise PayloadError "cannot read the payload"
    for ((i = 0; i < ${steps:-10}; i++)); do
        checkpoint
        sleep 0.1
    done
    printf '{"steps": %d}\n' "$i"
}

# ---------------------------------------------------------------------------------------
# Heartbeats: a background loop stamps the current run every HEARTBEAT seconds. The answer
# says whether cancellation was requested (t), or nothing comes back: the run is no longer
# ours (reaped, or fenced). Failures are logged, never fatal to the job.
# ---------------------------------------------------------------------------------------

beat() {
    local run_id answer
    run_id=$(cat "$STATE/current" 2>/dev/null) || return 0
    [[ -n $run_id ]] || return 0
    if ! answer=$(sql -v run_id="$run_id" -v worker="$WORKER" <<'SQL'
SELECT coalesce(cancel_requested::text, 'held')
  FROM jobs.heartbeat(ARRAY[:'run_id']::bigint[], :'worker', current_setting('pgtick.claim_token'))
SQL
    ); then
        log "run=$run_id heartbeat failed (the job keeps going)"
        return 0
    fi
    # 'held': still ours, but another transaction held the row, so it was not stamped this time.
    if [[ $answer == true && ! -e $STATE/cancel.$run_id ]]; then
        log "run=$run_id cancel requested"
        : >"$STATE/cancel.$run_id"
    elif [[ -z $answer && ! -e $STATE/lost.$run_id && $(cat "$STATE/current" 2>/dev/null) == "$run_id" ]]; then
        log "run=$run_id no longer ours (reaped or fenced): stopping it at its next checkpoint"
        : >"$STATE/lost.$run_id"
    fi
}

# The worker registry (jobs.workers, `pgtick workers`): who runs which kinds from which
# queues (NULL: every queue), seen when.
register() {
    if ! sql -v worker="$WORKER" -v kinds="${KINDS% }" -v host="$(hostname)" -v pid="$MAIN" \
        -v queue="$QUEUE" >/dev/null <<'SQL'
SELECT jobs.register_worker(:'worker', string_to_array(:'kinds', ' '), :'host', :'pid',
                            queues => CASE WHEN :'queue' <> '' THEN ARRAY[:'queue'] END)
SQL
    then
        log "cannot register the worker yet (database unavailable?); trying again on the next beat"
    fi
}

SEEN=-1
seen() { # stamp this worker alive, at most once a second; NULL: not registered (register again)
    # Waits at most a second for a lock on the registry (a migration holding it): the next
    # heartbeat of the run must not wait for it.
    local answer
    ((SECONDS != SEEN)) || return 0
    SEEN=$SECONDS
    answer=$(sql -v worker="$WORKER" <<<"SET lock_timeout = '1s'; SELECT jobs.worker_seen(:'worker')") || return 0
    [[ -n $answer ]] || register
}

heartbeat_loop() {
    # A SIGTERM to the whole process group (systemd does that) must not stop heartbeats
    # while the job drains: only the main loop stops this loop (USR1), or its own death.
    trap '' TERM INT
    trap 'kill "$NAP" 2>/dev/null; exit 0' USR1
    trap ':' USR2 # beat now
    while kill -0 "$MAIN" 2>/dev/null; do
        sleep "$HEARTBEAT" &
        NAP=$!
        wait "$NAP"
        kill "$NAP" 2>/dev/null
        beat
        seen
    done
}

# ---------------------------------------------------------------------------------------
# Reporting: each call is fenced by the worker id and claim token in the database, so
# repeating it after a lost connection is harmless. Keep trying while the database does not answer.
# ---------------------------------------------------------------------------------------

report() { # report SQL-ARGS...: run the statement on stdin, retrying while the server is away
    local input out status tries=0
    input=$(cat)
    while :; do
        out=$(sql "$@" <<<"$input")
        status=$?
        # 2: psql could not reach the server. Anything else is an answer (0), a refusal (3),
        # or a problem no retry fixes.
        if ((status != 2)) || ((++tries >= REPORT_TRIES)); then
            printf '%s' "$out"
            return "$status"
        fi
        log "database unavailable while reporting (try $tries); retrying"
        sleep 1
    done
}

unreported() { # unreported RUN_ID STATUS: say why a report did not happen
    log "run=$1 outcome not reported (psql exit $2): the reaper will hand the run on"
    # Still RUNNING for this worker until the reaper ends it, and its job ran: a hand back
    # after a failed claim must not queue it again as if it never had (hand_back_lost_claim).
    printf '%s\n' "$1" >>"$STATE/left"
}

complete_run() { # complete_run RUN_ID RESULT
    local applied status
    # VERBOSITY=verbose puts the SQLSTATE in psql's error lines, kept to tell why it refused.
    applied=$(report -v VERBOSITY=verbose -v run_id="$1" -v worker="$WORKER" -v result="$2" \
        2>"$STATE/complete.err" <<'SQL'
SELECT jobs.complete(:'run_id', :'worker', nullif(:'result', '')::jsonb, current_setting('pgtick.claim_token'))
SQL
    )
    status=$?
    cat "$STATE/complete.err" >&2
    # The result was refused: not JSON (22P02), a \u0000 text cannot hold (22P05), too large
    # or too deep (22023, 54001), not UTF-8 (42601: psql could not quote it, so the statement
    # reached the server unquoted). Any other error (a lock or statement timeout, a server
    # shutting down) says nothing about a job that succeeded: it is not failed for it.
    if ((status == 3)) && grep -qE '^ERROR:  (22P02|22P05|22023|54001|42601):' "$STATE/complete.err"; then
        fail_run "$1" InvalidResult "the job printed a result that is not a JSON document"
    else
        reported "$1" "$status" "$applied" complete completed
    fi
}

reported() { # reported RUN_ID PSQL_STATUS APPLIED CALL DONE: log what a fenced call did
    if (($2 != 0)); then
        unreported "$1" "$2"
    elif [[ $3 == t ]]; then
        log "run=$1 $5"
    else
        log "run=$1 $4 not applied: no longer RUNNING for this worker (fenced)"
    fi
}

fail_run() { # fail_run RUN_ID CLASS MESSAGE
    local answer status id next
    answer=$(report -v VERBOSITY=verbose -v run_id="$1" -v worker="$WORKER" -v class="$2" -v message="$3" \
        2>"$STATE/fail.err" <<'SQL'
SELECT (f).id, (f).status
  FROM jobs.fail(:'run_id', :'worker', ARRAY[:'class', 'ShellError'], :'message',
                 claim_token => current_setting('pgtick.claim_token')) AS f
SQL
    )
    status=$?
    cat "$STATE/fail.err" >&2
    # The class or message was refused: not UTF-8 (42601: psql could not quote it; 22021 from
    # the server), or not a class name (22023). Any other error is no reason to report
    # another class, which the policy may retry.
    if ((status == 3)) && grep -qE '^ERROR:  (42601|22021|22P05|22023):' "$STATE/fail.err"; then
        set -- "$1" ShellError "the job's error class or message could not be stored (not UTF-8, or too long)"
        log "run=$1 $3"
        answer=$(report -v run_id="$1" -v worker="$WORKER" -v message="$3" <<'SQL'
SELECT (f).id, (f).status
  FROM jobs.fail(:'run_id', :'worker', ARRAY['ShellError'], :'message',
                 claim_token => current_setting('pgtick.claim_token')) AS f
SQL
        )
        status=$?
    fi
    IFS=$'\t' read -r id next <<<"$answer"
    if ((status != 0)); then
        unreported "$1" "$status"
    elif [[ -z $id ]]; then
        log "run=$1 fail not applied: no longer RUNNING for this worker (fenced)"
    elif [[ $next == QUEUED ]]; then
        log "run=$1 failed class=$2: $3; retry queued as run=$id"
    else
        log "run=$1 failed class=$2: $3; no retry"
    fi
}

acknowledge_cancel() { # acknowledge_cancel RUN_ID
    local applied
    applied=$(report -v run_id="$1" -v worker="$WORKER" <<'SQL'
SELECT jobs.acknowledge_cancel(:'run_id', :'worker', 'cancelled at a checkpoint',
                               current_setting('pgtick.claim_token'))
SQL
    )
    reported "$1" $? "$applied" cancel cancelled
}

# ---------------------------------------------------------------------------------------
# One run: start the job in the background, wait for it (or for the grace period once
# stopping), report the outcome.
# ---------------------------------------------------------------------------------------

run_one() {
    local run_id kind attempt payload rc deadline=""
    IFS=$'\t' read -r run_id kind attempt payload <<<"$1"
    printf '%s\n' "$run_id" >"$STATE/current"
    kill -USR2 "$HB_PID" 2>/dev/null # first heartbeat right away
    log "run=$run_id kind=$kind attempt=$attempt started"
    # The main loop decides when a job stops (grace period), so the job ignores SIGTERM and
    # SIGINT. A forked subshell resets caught signals to their default but keeps ignored
    # ones: ignoring them here across the fork closes the window in which a SIGTERM to the
    # process group would kill the job before it could ignore it itself. (A SIGTERM within
    # the fork itself now reaches neither: the service manager's stop timeout then ends the
    # worker, and the reaper hands the run on. Before, such a job died and its run failed.)
    trap '' TERM INT
    (
        trap 'echo $? >"$STATE/rc.$PGTICK_RUN_ID"' EXIT
        export PGTICK_RUN_ID=$run_id PGTICK_KIND=$kind PGTICK_ATTEMPT=$attempt PGTICK_PAYLOAD=$payload
        "job_$kind"
    ) >"$STATE/out.$run_id" 2>"$STATE/err.$run_id" &
    JOB=$!
    trap on_signal TERM INT
    while [[ ! -e $STATE/rc.$run_id ]] && kill -0 "$JOB" 2>/dev/null; do
        if ((!STOP)); then
            wait "$JOB" # returns when the job ends, or at once when a signal arrives
            continue
        fi
        if [[ -z $deadline ]]; then
            deadline=$((SECONDS + GRACE))
            log "stopping: run=$run_id has ${GRACE}s to finish"
        fi
        if ((SECONDS >= deadline)); then
            kill_job
            rm -f "$STATE/current" # no more heartbeats: the reaper hands the run on
            log "grace over; leaving run=$run_id to the reaper"
            cleanup_run "$run_id"
            return
        fi
        pause 0.1
    done
    wait "$JOB" 2>/dev/null
    JOB=""
    rc=$(cat "$STATE/rc.$run_id" 2>/dev/null || echo 137)
    rm -f "$STATE/current" # stop heartbeating: from here on the run's fate is our report

    if [[ -e $STATE/lost.$run_id ]]; then
        log "run=$run_id abandoned: its result is not reported"
    elif ((rc == 0)); then
        complete_run "$run_id" "$(cat "$STATE/out.$run_id")"
    elif [[ -e $STATE/cancel.$run_id ]]; then
        acknowledge_cancel "$run_id"
    else
        local class message
        class=$(cat "$STATE/class.$run_id" 2>/dev/null || echo "Exit$rc")
        message=$(tail -n 1 "$STATE/err.$run_id")
        fail_run "$run_id" "$class" "${message:-exit status $rc}"
    fi
    cleanup_run "$run_id"
}

cleanup_run() { rm -f "$STATE"/{rc,out,err,class,cancel,lost}."$1"; }

kill_job() { # the job's subshell and the command it is running
    if [[ -n $JOB ]]; then
        disown "$JOB" 2>/dev/null # no "Killed" notice from bash
        pkill -KILL -P "$JOB" 2>/dev/null
        kill -KILL "$JOB" 2>/dev/null
    fi
}

# ---------------------------------------------------------------------------------------
# Main loop: claim one run of our kinds; none due: wait POLL seconds (or for a signal).
# ---------------------------------------------------------------------------------------

STOP=0
JOB=""
on_signal() {
    if ((STOP)); then
        log "second signal: exiting now"
        kill_job
        exit 1
    fi
    STOP=1
    log "signal: stopping (claiming nothing more, draining)"
}

shutdown() {
    kill -USR1 "$HB_PID" 2>/dev/null
    wait "$HB_PID" 2>/dev/null
    sql -v worker="$WORKER" >/dev/null <<<"SELECT jobs.worker_stopped(:'worker')" # stopped, not lost
    rm -rf "$STATE"
    log "stopped"
}

KINDS=$(compgen -A function job_ | sed 's/^job_//' | tr '\n' ' ')
register
heartbeat_loop &
HB_PID=$!
trap on_signal TERM INT
trap shutdown EXIT
log "started kinds=${KINDS% }${QUEUE:+ queue=$QUEUE}"

# The claim's answer goes to a file, not through $(...): a command substitution runs in a
# subshell that a SIGTERM to the process group would kill while psql (which ignores it)
# commits the claim, and the claimed run would be lost to this worker.
#
# A claim that failed may have committed all the same (the connection broke after the commit:
# a network cut, a server restart): its run is then RUNNING for this worker, which never
# learnt of it, and only the reaper would end it, spending an attempt. So, before the next
# claim, the worker hands back every run RUNNING for its id and token (it holds none between
# runs) but those whose outcome it could not report ($STATE/left: their job ran): QUEUED as
# it was, same attempt (docs/other-languages.md).
LOST_CLAIM=0
hand_back_lost_claim() {
    local left
    left=$(tail -n 5000 "$STATE/left" 2>/dev/null | paste -sd, -)
    sql -v worker="$WORKER" -v left="{$left}" >"$STATE/handed" <<'SQL' || return 1
SELECT run_id, status FROM jobs.hand_back_unheld(:'left', :'worker', claim_token => current_setting('pgtick.claim_token'))
SQL
    LOST_CLAIM=0
    if [[ -s $STATE/handed ]]; then
        log "handed back runs of the failed claim: $(tr '\t\n' '= ' <"$STATE/handed")"
    fi
}

while ((!STOP)); do
    line=""
    if ((LOST_CLAIM)) && ! hand_back_lost_claim; then
        log "cannot hand back what the failed claim may have taken yet; retrying in ${POLL}s"
        pause "$POLL"
        continue
    fi
    if ! sql -v worker="$WORKER" -v kinds="${KINDS% }" -v queue="$QUEUE" >"$STATE/claim" <<'SQL'
SELECT id, kind, attempt, payload::text
  FROM jobs.claim(1, :'worker', string_to_array(:'kinds', ' '),
                  queues => CASE WHEN :'queue' <> '' THEN ARRAY[:'queue'] END,
                  claim_token => current_setting('pgtick.claim_token'))
SQL
    then
        log "claim failed (database unavailable?); retrying in ${POLL}s"
        LOST_CLAIM=1
        pause "$POLL"
        continue
    fi
    IFS= read -r line <"$STATE/claim" || true
    if [[ -z $line ]]; then
        pause "$POLL"
    else
        run_one "$line" # a run claimed while a signal arrived is still run (within the grace)
    fi
done
if ((LOST_CLAIM)) && ! hand_back_lost_claim; then
    log "cannot hand back what the failed claim may have taken (the reaper will)"
fi
exit 0
