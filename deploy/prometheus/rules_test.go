// Package prometheus holds shardgate's Prometheus rules (rules.yml) and their promtool unit
// tests (rules_test.yml). It has no code; its tests check the rules against the router's code.
package prometheus

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// ruleFile is rules.yml. Decoding is strict, so a misspelt key is an error, not a silently
// missing field.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile("rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("rules.yml: %v", err)
	}
	return f
}

var (
	// seriesName finds shardgate metric and recording-rule names in a PromQL expression.
	seriesName    = regexp.MustCompile(`\bshardgate[_:][a-z0-9_:]*[a-z0-9]`)
	outcomeValue  = regexp.MustCompile(`outcome\s*=~?\s*"([^"]*)"`)
	recordingName = regexp.MustCompile(`^shardgate:[a-z0-9_]+:[a-z0-9_]+$`) // level:metric:operations
	metricLiteral = regexp.MustCompile(`^shardgate_[a-z0-9_]+$`)
)

// codeStrings returns every string literal in the module's non-test Go code, read from the
// source, so that the rules are checked against the code and not against a copy of its names.
func codeStrings(t *testing.T) map[string]bool {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", root, err)
	}
	lits := map[string]bool{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					lits[s] = true
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return lits
}

// exported reports whether the code defines metric name, directly or as a histogram's series.
func exported(lits map[string]bool, name string) bool {
	if !metricLiteral.MatchString(name) {
		return false
	}
	for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && lits[base] {
			return true
		}
	}
	return false
}

func TestRulesAreCompleteAndNameExportedMetrics(t *testing.T) {
	f := readRules(t)
	lits := codeStrings(t)
	for _, name := range []string{"shardgate_transfers_total", "shardgate_upkeep_last_success_timestamp_seconds"} {
		if !lits[name] {
			t.Fatalf("%s not found in the code: the source scan is broken", name)
		}
	}

	records := map[string]bool{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				records[r.Record] = true
			}
		}
	}
	alertsUsing := map[string][]string{} // series name → alerts whose expr names it
	alerts := map[string]bool{}
	for _, g := range f.Groups {
		if g.Name == "" || len(g.Rules) == 0 {
			t.Errorf("group %q: needs a name and rules", g.Name)
		}
		for _, r := range g.Rules {
			id := r.Alert + r.Record
			switch {
			case (r.Alert == "") == (r.Record == ""):
				t.Errorf("group %s: a rule must be either an alert or a record: %+v", g.Name, r)
				continue
			case strings.TrimSpace(r.Expr) == "":
				t.Errorf("%s: no expr", id)
			}
			if r.Record != "" {
				if !recordingName.MatchString(r.Record) {
					t.Errorf("recording rule %s: name should be level:metric:operations", r.Record)
				}
				if r.For != "" || len(r.Annotations) > 0 {
					t.Errorf("recording rule %s: for and annotations belong to alerts", r.Record)
				}
			} else {
				if alerts[r.Alert] {
					t.Errorf("alert %s is defined twice", r.Alert)
				}
				alerts[r.Alert] = true
				if r.For == "" {
					t.Errorf("alert %s: no for", r.Alert)
				}
				if sev := r.Labels["severity"]; sev != "warning" && sev != "critical" {
					t.Errorf("alert %s: labels.severity is %q, want warning or critical", r.Alert, sev)
				}
				for _, a := range []string{"summary", "description"} {
					if strings.TrimSpace(r.Annotations[a]) == "" {
						t.Errorf("alert %s: no annotations.%s", r.Alert, a)
					}
				}
			}
			names := seriesName.FindAllString(r.Expr, -1)
			if len(names) == 0 {
				t.Errorf("%s: expr names no shardgate series: %s", id, r.Expr)
			}
			for _, n := range names {
				if !records[n] && !exported(lits, n) {
					t.Errorf("%s: %s is neither a metric the code exports nor a recording rule of this file", id, n)
				}
				if r.Alert != "" {
					alertsUsing[n] = append(alertsUsing[n], r.Alert)
				}
			}
			for _, m := range outcomeValue.FindAllStringSubmatch(r.Expr, -1) {
				if !lits[m[1]] {
					t.Errorf("%s: outcome %q is not an outcome the code counts", id, m[1])
				}
			}
		}
	}

	if !records["shardgate:replay_ratio:rate5m"] {
		t.Error("no recording rule shardgate:replay_ratio:rate5m")
	}
	// What must be alerted on: upkeep behind, no future partition, drops not happening, a
	// jump of the replay rate, credits owed too long, slow credits, credit delivery conflicts, stalling groups,
	// a ledger discrepancy, a reconcile that no longer completes, requests for a moving range
	// answered 503, a stalled range move and one stopped behind its fence.
	for _, n := range []string{
		"shardgate_upkeep_last_success_timestamp_seconds",
		"shardgate_idempotency_future_partitions",
		"shardgate_idempotency_oldest_partition_age_seconds",
		"shardgate:replay_ratio:rate5m",
		"shardgate_credit_oldest_owed_age_seconds",
		"shardgate_credit_deliveries_total",
		"shardgate_credit_delay_seconds_bucket",
		"shardgate_group_commit_stalls_total",
		"shardgate_reconcile_discrepancies",
		"shardgate_reconcile_last_success_timestamp_seconds",
		"shardgate_buffered_requests_total",
		"shardgate_range_move_progress_timestamp_seconds",
		"shardgate_range_move_phase",
	} {
		if len(alertsUsing[n]) == 0 {
			t.Errorf("no alert uses %s", n)
		}
	}
}

// alertName finds alert names (ShardgateSomething) in prose.
var alertName = regexp.MustCompile(`\bShardgate[A-Z][A-Za-z]+\b`)

// TestDocumentedAlertsExist keeps the documentation's references to alerts (README.md and
// docs/) in step with rules.yml, so that an operator told "the alert X fires" finds X.
func TestDocumentedAlertsExist(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := map[string]bool{}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
		}
	}
	for _, path := range append([]string{filepath.Join("..", "..", "README.md")}, docs...) {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range alertName.FindAllString(string(text), -1) {
			if !alerts[name] {
				t.Errorf("%s names alert %s, which rules.yml does not define", path, name)
			}
		}
	}
}

// promtool checks the rules the way Prometheus loads them and runs rules_test.yml. It comes
// with Debian's prometheus package (scripts/ensure-deps.sh installs it); without it the check is
// skipped, except in CI, where a skipped check would be a check that checked nothing.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI is set and promtool is missing: run scripts/ensure-deps.sh (apt-get install prometheus)")
		}
		t.Skip("promtool not installed (apt-get install prometheus)")
	}
	for _, args := range [][]string{{"check", "rules", "rules.yml"}, {"test", "rules", "rules_test.yml"}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
