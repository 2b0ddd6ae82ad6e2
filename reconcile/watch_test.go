package reconcile

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/testkit"
)

type testWatcher struct {
	*Watcher
	reg  *prometheus.Registry
	logs *testkit.SyncBuffer
}

func (b *bank) watcher() testWatcher {
	b.t.Helper()
	cfg, err := config.Parse("router.yaml", []byte("auth:\n  mode: none\nreconcile:\n  interval: 10s\n  window: 1h\n"))
	if err != nil {
		b.t.Fatal(err)
	}
	w := testWatcher{reg: prometheus.NewPedanticRegistry(), logs: &testkit.SyncBuffer{}}
	w.Watcher = NewWatcher(cfg, fixedTopology{b.topo}, slog.New(slog.NewTextHandler(w.logs, nil)), w.reg)
	b.t.Cleanup(w.Close)
	return w
}

// gauge is the value of shardgate_reconcile_discrepancies{kind}, and whether it is exported.
func (w testWatcher) gauge(t *testing.T, kind string) (float64, bool) {
	return w.value(t, "shardgate_reconcile_discrepancies", kind)
}

// value is the sample of family name (whose one label is label, if given), and whether there is one.
func (w testWatcher) value(t *testing.T, name string, label ...string) (float64, bool) {
	t.Helper()
	families, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if len(label) == 0 || m.GetLabel()[0].GetValue() == label[0] {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue(), true
				}
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

// Of two routers, one checks at a time: the one holding the watch lock exports the figures, the
// other exports none. A lost credit shows at the next check, and is logged; when the checking
// router stops, the other takes over.
func TestWatcherOneRouterChecks(t *testing.T) {
	b := newBank(t)
	ctx := context.Background()
	a1, b1 := account(b.m, "sa", 1), account(b.m, "sb", 1)
	b.pay("t-1", a1, b1, 10)
	b.deliver()
	first, second := b.watcher(), b.watcher()
	if !first.Check(ctx) || second.Check(ctx) {
		t.Fatal("want the first router to check and the second to wait")
	}
	if v, ok := first.gauge(t, "missing_credit"); !ok || v != 0 {
		t.Errorf("first router: missing_credit %v (exported %t), want 0", v, ok)
	}
	if _, ok := second.gauge(t, "missing_credit"); ok {
		t.Error("the waiting router exports discrepancy figures")
	}
	l1, _ := first.value(t, "shardgate_reconcile_leader")
	l2, _ := second.value(t, "shardgate_reconcile_leader")
	if got := l1 + 10*l2; got != 1 {
		t.Errorf("leader gauges: first + 10*second = %v, want 1", got)
	}

	b.exec("sb", "DELETE FROM ledger_entries WHERE transfer_id = 't-1' AND kind = 'transfer_in'")
	if !first.Check(ctx) {
		t.Fatal("the checking router stopped checking")
	}
	if v, _ := first.gauge(t, "missing_credit"); v != 1 {
		t.Errorf("missing_credit %v after a credit was lost, want 1", v)
	}
	if v, _ := first.gauge(t, "unbalanced_currency"); v != 0 {
		t.Errorf("unbalanced_currency %v, want 0: the missing credit is accounted for", v)
	}
	if log := first.logs.String(); !strings.Contains(log, "LEDGER DISCREPANCY") || !strings.Contains(log, "t-1@sa") {
		t.Errorf("log does not report the discrepancy with its transfer and shard:\n%s", log)
	}
	runs, _ := first.value(t, "shardgate_reconcile_runs_total", "discrepancies")
	last, _ := first.value(t, "shardgate_reconcile_last_success_timestamp_seconds")
	if runs != 1 || last < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Error("runs_total{result=discrepancies} or the last success time not updated")
	}

	first.Close()
	if !second.Check(ctx) {
		t.Fatal("the second router did not take over once the first stopped")
	}
	if v, _ := second.gauge(t, "missing_credit"); v != 1 {
		t.Errorf("second router: missing_credit %v, want 1", v)
	}
}
