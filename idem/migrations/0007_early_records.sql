-- 0007: the partitions a shard held when it was upgraded to 0006 leave every lookup within hours
-- instead of with retention. Same signatures, outcomes, locks and order of checks as 0006.
--
-- 0006 keeps every partition that begins before shardgate_record_floor.unchecked_before in every
-- key lookup, because records written before it were never held to the rule that no record is
-- dated before its key's floor: a client clock ahead of the shard's dated some early, by about the
-- clocks' difference. Upkeep now reads each such partition once, newest first, for how early its
-- records are dated (idem.bringUnderRule), and in one transaction raises early_by to that and
-- lowers unchecked_before past the partition. So a record dated before unchecked_before may
-- predate its key's floor by any time, and any other by at most early_by, and a lookup reads
-- records dated from the earliest floor of its group less early_by on, as well as those before
-- unchecked_before. Nothing is rewritten: a completed record never changes.
--
-- Adding the column takes shardgate_record_floor's ACCESS EXCLUSIVE lock for a moment; every
-- transfer reads that table, so this waits for those in flight, at most 10 s, then fails whole
-- (router migrate says so) and can simply be run again. The functions that read early_by live
-- in idem/sql/.
SET LOCAL lock_timeout = '10s';
ALTER TABLE shardgate_record_floor
    ADD COLUMN early_by interval NOT NULL DEFAULT '0' CONSTRAINT early_by_not_negative CHECK (early_by >= '0');
