-- Schema version 1, revision 7 (see migrate.go): a release serves each
-- key's queue once.
--
-- Before it, inflight_release served a key's queue after each lease it
-- removed, so of a batch of leases on one key the first unit freed could
-- go to a light waiter behind a heavy one that the batch as a whole lets
-- in. Now it removes every pair first, then serves each key, in the order
-- the keys first appear, under the lowest limit the call gives the key
-- (driver.ReleaseCall). Where serving stops at its bound with room left,
-- it goes on from there, up to once for each pair on the key, as serving
-- once per lease did. The signature is the same, so a process of an
-- earlier release calls this one.
--
-- (Replaced by silence.sql, revision 12, by a call of the signature with
-- ttl, which finds no silence.)

CREATE OR REPLACE FUNCTION inflight_release(f text, claim bigint, keys text[], leases text[], limits bigint[], async bool) RETURNS void LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	now bigint;
	serving bool;
	k text;
	lim bigint;
	n int;
	r int;
BEGIN
	SELECT * INTO now, serving FROM inflight_freeing(f, keys, async);
	FOR i IN 1..coalesce(array_length(keys, 1), 0) LOOP
		DELETE FROM inflight_lease x WHERE x.fleet = f AND x.key = keys[i] AND x.lease = leases[i];
	END LOOP;
	IF NOT serving THEN
		RETURN;
	END IF;
	FOR k, lim, n IN SELECT p.key, min(p.lim), count(*) FROM unnest(keys, limits) WITH ORDINALITY AS p(key, lim, i)
			GROUP BY p.key ORDER BY min(p.i) LOOP
		r := inflight_serve(f, k, lim, now, claim, 0);
		WHILE r > 0 AND n > 1 LOOP
			r := inflight_serve(f, k, lim, now, claim, r - 1);
			n := n - 1;
		END LOOP;
	END LOOP;
END $$;
