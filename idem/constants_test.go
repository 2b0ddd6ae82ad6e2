package idem

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

// TestSQLConstantsMatchMigrations holds the numbers that SQL and Go share together: every
// advisory lock a migration or function file takes in (classid, objid) form is LockClass with a lock Go names,
// the ownership lock is among them, and every per-key lock hashes with the key or request seed
// over the text that seed stands for.
func TestSQLConstantsMatchMigrations(t *testing.T) {
	ms, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	fns, err := Functions()
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for _, m := range ms {
		all.WriteString(m.SQL)
	}
	for _, f := range fns {
		all.WriteString(f.SQL)
	}
	sql := all.String()

	pairLock := regexp.MustCompile(`pg_(?:try_)?advisory_(?:xact_)?lock(?:_shared)?\((\d+),\s*(\d+)\)`)
	named := map[string]bool{fmt.Sprint(LockMigrate): true, fmt.Sprint(LockOwnership): true, fmt.Sprint(LockUpkeep): true, fmt.Sprint(LockApply): true}
	sawOwnership := false
	for _, m := range pairLock.FindAllStringSubmatch(sql, -1) {
		if m[1] != fmt.Sprint(LockClass) || !named[m[2]] {
			t.Errorf("migration takes lock (%s, %s); Go names class %d and objids 0-3", m[1], m[2], LockClass)
		}
		sawOwnership = sawOwnership || m[2] == fmt.Sprint(LockOwnership)
	}
	if !sawOwnership {
		t.Errorf("no migration takes the ownership lock (%d, %d)", LockClass, LockOwnership)
	}

	keyLock := regexp.MustCompile(`hashtextextended\(([^()]*),\s*(\d+)\)`)
	seen := map[string]bool{}
	for _, m := range keyLock.FindAllStringSubmatch(sql, -1) {
		text, seed := m[1], m[2]
		want := fmt.Sprint(KeyLockSeed)
		if strings.Contains(text, "request_hash") {
			want = fmt.Sprint(RequestLockSeed)
		}
		if seed != want {
			t.Errorf("hashtextextended(%s, %s): want seed %s", text, seed, want)
		}
		seen[seed] = true
	}
	if !seen[fmt.Sprint(KeyLockSeed)] || !seen[fmt.Sprint(RequestLockSeed)] {
		t.Errorf("the migrations use seeds %v; want both the key lock seed %d and the request lock seed %d", seen, KeyLockSeed, RequestLockSeed)
	}
}
