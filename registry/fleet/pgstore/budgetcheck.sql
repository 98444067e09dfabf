-- Schema version 1, revision 23 (see migrate.go): a budget's check.
--
-- inflight_budget (budgetfloor.sql's) takes move without correct, which
-- no release before this one sends (it sends move only with correct), for
-- a check (driver.BudgetCall's Check): it charges nothing and answers as a
-- charge of cost that did not fit, at 0 if cost fits now. A client refused
-- by a budget's tokens asks so of its requests, to tell when both take the
-- request. It keeps its signature and the meaning of the answers the
-- releases before get.
CREATE OR REPLACE FUNCTION inflight_budget(f text, k text, correct bool, move bool, charged_in bigint, limits bigint[], cost bigint[]) RETURNS bigint[] LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
	now bigint;
	cur bigint;
	first bigint;
	used bigint[];
	d bigint[] := cost;
	e bigint[];
	s bigint;
	fits bool := true;
	at bigint := 0;
	binding bigint := 0;
	lft bigint;
	r record;
BEGIN
	PERFORM inflight_begin(true);
	PERFORM pg_advisory_xact_lock(hashtextextended('inflight_budget' || chr(31) || f || chr(31) || k, 0));
	now := inflight_now_us() / 1000;
	-- A clock set back does not move the window back: it stays at the
	-- latest step charged.
	SELECT greatest(now / 1000, max(x.step)) INTO cur FROM inflight_budget x WHERE x.fleet = f AND x.key = k;
	first := cur - 60;
	DELETE FROM inflight_budget x WHERE x.fleet = f AND x.key = k AND x.step < first;
	SELECT ARRAY[coalesce(sum(x.t0), 0), coalesce(sum(x.t1), 0), coalesce(sum(x.t2), 0)]::bigint[] INTO used
		FROM inflight_budget x WHERE x.fleet = f AND x.key = k;
	IF correct AND move THEN
		IF charged_in <> cur THEN
			IF charged_in >= first THEN
				e := inflight_budget_add(f, k, charged_in, ARRAY[-cost[1], -cost[2], -cost[3]]);
				used := ARRAY[used[1] + e[1], used[2] + e[2], used[3] + e[3]];
			END IF;
			e := inflight_budget_add(f, k, cur, cost);
			used := ARRAY[used[1] + e[1], used[2] + e[2], used[3] + e[3]];
		END IF;
		RETURN ARRAY[1, cur, used[1], used[2], used[3], 0, 0, now];
	END IF;
	IF correct THEN
		s := charged_in;
		IF charged_in < first OR charged_in > cur THEN
			s := cur; -- a debt, or nothing to return
			d := ARRAY[greatest(cost[1], 0), greatest(cost[2], 0), greatest(cost[3], 0)];
		END IF;
	ELSE
		s := cur;
		FOR p IN 1..3 LOOP
			IF limits[p] > 0 AND used[p] > 0 AND used[p] + cost[p] > limits[p] THEN
				fits := false;
			END IF;
		END LOOP;
	END IF;
	IF fits AND NOT move THEN -- move here, without correct, is a check
		e := inflight_budget_add(f, k, s, d);
		RETURN ARRAY[1, cur, used[1] + e[1], used[2] + e[2], used[3] + e[3], 0, 0, now];
	END IF;
	FOR p IN 1..3 LOOP
		IF limits[p] > 0 AND used[p] > 0 AND used[p] + cost[p] > limits[p] THEN
			lft := used[p];
			FOR r IN SELECT x.step, x.t0, x.t1, x.t2 FROM inflight_budget x WHERE x.fleet = f AND x.key = k ORDER BY x.step LOOP
				lft := lft - CASE p WHEN 1 THEN r.t0 WHEN 2 THEN r.t1 ELSE r.t2 END;
				IF lft <= 0 OR lft + cost[p] <= limits[p] THEN
					IF (r.step + 61) * 1000 > at THEN
						at := (r.step + 61) * 1000;
						binding := p - 1;
					END IF;
					EXIT;
				END IF;
			END LOOP;
		END IF;
	END LOOP;
	RETURN ARRAY[0, cur, used[1], used[2], used[3], at, binding, now];
END $$;
