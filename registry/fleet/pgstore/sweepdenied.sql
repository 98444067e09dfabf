-- Schema version 1, revision 16 (see migrate.go): a sweep that the role
-- may not make counts as made.
--
-- A role without DELETE on inflight_key cannot sweep (see
-- inflight_sweep_keys): its sweep's changes, the sweeper's time among
-- them, were undone with the refusal, so the next renewal of every
-- process found the sweep due again, looked at up to 256 keys once more
-- and wrote one more warning to the server's log. A refused sweep now
-- takes the sweeper's time as a sweep does: the warning, and the work,
-- come at most once a sweep interval per fleet. (In a fleet whose
-- processes run under roles with and without DELETE, a refused sweep
-- takes its turn too: the keys are swept less often, none skipped.)
-- inflight_sweep_keys keeps its signature; this revision only replaces
-- it, and can be made again over itself.

CREATE OR REPLACE FUNCTION inflight_sweep_keys(f text) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	now bigint;
BEGIN
	IF current_setting('transaction_isolation') <> 'read committed' THEN
		RETURN;
	END IF;
	PERFORM set_config('synchronous_commit', 'off', true);
	now := inflight_now_us() / 1000;
	BEGIN
		PERFORM inflight_sweep(f, now);
	EXCEPTION WHEN insufficient_privilege THEN
		RAISE WARNING 'inflight: keys'' rows of fleet % not swept: %', f, SQLERRM;
		BEGIN
			-- Not if another call holds the sweeper: it sweeps, or notes it.
			UPDATE inflight_sweeper x SET swept = now WHERE x.fleet IN
				(SELECT y.fleet FROM inflight_sweeper y WHERE y.fleet = f FOR UPDATE SKIP LOCKED);
		EXCEPTION WHEN insufficient_privilege THEN
			NULL; -- a role that may not note it either: warned at each renewal, as before
		END;
	END;
END $$;
