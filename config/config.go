// Package config loads router.yaml: strict decoding (an unknown key or a value of the wrong
// kind is an error naming its line and key), defaults in one place, and validation that refuses
// a configuration that would be unsafe to run.
package config

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/shardgate/shardgate/partition"
)

// Config is a validated router.yaml. Only Parse and Load make one; defaults live in Parse.
type Config struct {
	Listen       string
	ShardmapPath string // absolute, or relative to the working directory if router.yaml was
	Idempotency  Idempotency
	Auth         Auth
	Transfers    Transfers
	ShardPool    ShardPool
	GroupCommit  GroupCommit
	ReplayCache  ReplayCache
	Relay        Relay
	Reconcile    Reconcile
	Buffering    Buffering
	RangeMoves   RangeMoves
	HTTP         HTTP
	TLS          TLS
	Admin        Admin
}

// HTTP bounds what one client connection may cost.
type HTTP struct {
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	MaxHeaderBytes                                            int
}

// TLS, when CertFile is set, serves the API over HTTPS; ClientCAFile additionally requires
// every client to present a certificate signed by that CA (mutual TLS).
type TLS struct {
	CertFile, KeyFile, ClientCAFile string
}

// Admin protects /admin/* and /metrics: served on their own Listen address when set (and then
// not on the API listener), and requiring a bearer token whose SHA-256 is TokenSHA256 when set.
type Admin struct {
	Listen      string
	TokenSHA256 *[32]byte
}

// Idempotency is how long keys live and how their table is partitioned.
type Idempotency struct {
	Retention            time.Duration // keys are kept at least this long
	PartitionInterval    partition.Interval
	PartitionsAhead      int           // future partitions kept ready by upkeep
	ReplayWindow         time.Duration // the slowest retry path operated; Retention >= 2x this
	InProgressRetryAfter time.Duration // Retry-After on 409
}

// Auth says how clients are identified. Mode "none" serves one client named "anonymous".
type Auth struct {
	Mode    string // "tokens" or "none"
	Clients []Client
}

// AnonymousClient names the single client of auth mode "none".
const AnonymousClient = "anonymous"

// Client is one API client: its name becomes part of every idempotency scope it uses.
type Client struct {
	Name        string
	TokenSHA256 [32]byte // SHA-256 of the bearer token; the token itself is never configured
}

// Transfers holds request rules for POST /transfers.
type Transfers struct {
	DefaultCurrency string
	MaxBodyBytes    int64
}

// ShardPool is how the router talks to each shard.
type ShardPool struct {
	MaxConns       int32
	MaxWaiting     int // requests allowed to wait for a busy shard's connection; more get 503 at once
	ConnectTimeout time.Duration
	RequestTimeout time.Duration // deadline for one transfer's round trip on its shard
	RetryAfter     time.Duration // Retry-After on 503
	// Session holds settings every connection of serve's pools opens with (not read from
	// router.yaml): the relay's credit lease, when it delivers its router's credits itself.
	Session map[string]string
}

// GroupCommit sends concurrent new-key transfers bound for one shard to it together: one
// statement and one commit for the group. Nothing waits for a timer to form a group: a transfer
// that finds fewer than InFlight groups of its shard in flight goes at once, and a group forms
// only from transfers that arrive while InFlight are. A group still in flight after StallAfter
// (blocked on a lock, say) stops counting against InFlight, so the next goes beside it, up to
// MaxInFlight groups in all. Both counts are capped at shard_pool.max_conns.
type GroupCommit struct {
	MaxBatch    int           // transfers in one group at most; 1 sends every transfer alone
	InFlight    int           // groups of one shard in flight at once while none has stalled
	MaxInFlight int           // groups of one shard in flight at once, stalled ones included
	StallAfter  time.Duration // how long a group is in flight before it counts as stalled
}

// ReplayCache keeps, per router, the responses shards answered as completed, so that a retry
// of a completed key with the same request is replayed without a round trip to its shard. A
// completed record never changes, so a cached response is the stored one; entries live at most
// TTL, and TTL must stay below replay_window so that no retry the router accepts outlives
// retention through the cache.
type ReplayCache struct {
	MaxEntries int // 0 turns the cache off
	TTL        time.Duration
}

// Relay delivers the credits that debits owe to the shards that own their destination accounts
// (package relay); every `router serve` runs one unless Enabled is false.
type Relay struct {
	Enabled      bool
	PollInterval time.Duration // a pass over every shard at least this often
	Batch        int           // owed credits claimed per shard per statement
	Lease        time.Duration // how long a claimed credit is this relay's before another may take it over
	BackoffBase  time.Duration // first wait after a failed delivery, doubled per attempt
	BackoffMax   time.Duration // the longest wait
	KeepSettled  time.Duration // settled owed-credit rows are deleted by upkeep after this
	// ReoweWindow: when a destination shard's identity changes (a failover, a restore), credits
	// settled against it this recently are owed again and delivered once more.
	ReoweWindow time.Duration
}

// file mirrors router.yaml. Pointers tell "absent" from "zero" so defaults apply only to absent keys.
type file struct {
	Listen      *string `yaml:"listen"`
	Shardmap    *string `yaml:"shardmap"`
	Idempotency struct {
		Retention            *duration `yaml:"retention"`
		PartitionInterval    *string   `yaml:"partition_interval"`
		PartitionsAhead      *int      `yaml:"partitions_ahead"`
		ReplayWindow         *duration `yaml:"replay_window"`
		InProgressRetryAfter *duration `yaml:"in_progress_retry_after"`
	} `yaml:"idempotency"`
	Auth struct {
		Mode    *string `yaml:"mode"`
		Clients []struct {
			Name        string `yaml:"name"`
			TokenSHA256 string `yaml:"token_sha256"`
		} `yaml:"clients"`
	} `yaml:"auth"`
	Transfers struct {
		DefaultCurrency *string `yaml:"default_currency"`
		MaxBodyBytes    *int64  `yaml:"max_body_bytes"`
	} `yaml:"transfers"`
	ShardPool struct {
		MaxConns       *int32    `yaml:"max_conns"`
		MaxWaiting     *int      `yaml:"max_waiting"`
		ConnectTimeout *duration `yaml:"connect_timeout"`
		RequestTimeout *duration `yaml:"request_timeout"`
		RetryAfter     *duration `yaml:"retry_after"`
	} `yaml:"shard_pool"`
	GroupCommit struct {
		MaxBatch    *int      `yaml:"max_batch"`
		InFlight    *int      `yaml:"in_flight"`
		MaxInFlight *int      `yaml:"max_in_flight"`
		StallAfter  *duration `yaml:"stall_after"`
	} `yaml:"group_commit"`
	ReplayCache struct {
		MaxEntries *int      `yaml:"max_entries"`
		TTL        *duration `yaml:"ttl"`
	} `yaml:"replay_cache"`
	Relay struct {
		Enabled      *bool     `yaml:"enabled"`
		PollInterval *duration `yaml:"poll_interval"`
		Batch        *int      `yaml:"batch"`
		Lease        *duration `yaml:"lease"`
		BackoffBase  *duration `yaml:"backoff_base"`
		BackoffMax   *duration `yaml:"backoff_max"`
		KeepSettled  *duration `yaml:"keep_settled"`
		ReoweWindow  *duration `yaml:"reowe_window"`
	} `yaml:"relay"`
	Reconcile  reconcileFile  `yaml:"reconcile"`
	Buffering  bufferingFile  `yaml:"buffering"`
	RangeMoves rangeMovesFile `yaml:"range_moves"`
	HTTP       struct {
		ReadHeaderTimeout *duration `yaml:"read_header_timeout"`
		ReadTimeout       *duration `yaml:"read_timeout"`
		WriteTimeout      *duration `yaml:"write_timeout"`
		IdleTimeout       *duration `yaml:"idle_timeout"`
		MaxHeaderBytes    *int      `yaml:"max_header_bytes"`
	} `yaml:"http"`
	TLS struct {
		CertFile     string `yaml:"cert_file"`
		KeyFile      string `yaml:"key_file"`
		ClientCAFile string `yaml:"client_ca_file"`
	} `yaml:"tls"`
	Admin struct {
		Listen      string `yaml:"listen"`
		TokenSHA256 string `yaml:"token_sha256"`
	} `yaml:"admin"`
}

type duration struct{ time.Duration }

func (d *duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || n.Kind != yaml.ScalarNode {
		// A TypeError, so that the decoder goes on to the rest of the file; decode words it
		// with its line and key.
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("%s is not a duration (use e.g. 720h, 1s, 500ms)", describe(n))}}
	}
	d.Duration = v
	return nil
}

// Load reads and validates router.yaml at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

var (
	clientName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	currency   = regexp.MustCompile(`^[A-Z]{3}$`)
)

// Parse decodes and validates router.yaml content; path names the file in errors and anchors a
// relative shardmap path. Every problem found is reported, one per line. It runs in three
// steps: strict decoding, defaults for what is absent, and validation.
func Parse(path string, data []byte) (*Config, error) {
	f, err := decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c, problems := withDefaults(path, f)
	problems = append(problems, c.validate()...)
	if len(problems) > 0 {
		return nil, fmt.Errorf("%s: invalid configuration:\n  %s", path, strings.Join(problems, "\n  "))
	}
	return c, nil
}

// withDefaults is the one place defaults live: it fills every absent key and converts what the
// file spells as text (interval, token hashes), reporting text that does not convert.
func withDefaults(path string, f *file) (*Config, []string) {
	c := &Config{
		Listen:       deref(f.Listen, "127.0.0.1:8080"),
		ShardmapPath: rel(path, deref(f.Shardmap, "shardmap.yaml")),
		Idempotency: Idempotency{
			Retention:            durOr(f.Idempotency.Retention, 720*time.Hour),
			PartitionsAhead:      deref(f.Idempotency.PartitionsAhead, 3),
			ReplayWindow:         durOr(f.Idempotency.ReplayWindow, 168*time.Hour),
			InProgressRetryAfter: durOr(f.Idempotency.InProgressRetryAfter, time.Second),
		},
		Auth: Auth{Mode: deref(f.Auth.Mode, "tokens")},
		Transfers: Transfers{
			DefaultCurrency: deref(f.Transfers.DefaultCurrency, "EUR"),
			MaxBodyBytes:    deref(f.Transfers.MaxBodyBytes, 16<<10),
		},
		ShardPool: ShardPool{
			MaxConns:       deref(f.ShardPool.MaxConns, 16),
			MaxWaiting:     deref(f.ShardPool.MaxWaiting, 64),
			ConnectTimeout: durOr(f.ShardPool.ConnectTimeout, 2*time.Second),
			RequestTimeout: durOr(f.ShardPool.RequestTimeout, 5*time.Second),
			RetryAfter:     durOr(f.ShardPool.RetryAfter, time.Second),
		},
		GroupCommit: GroupCommit{MaxBatch: deref(f.GroupCommit.MaxBatch, 64), InFlight: deref(f.GroupCommit.InFlight, 1),
			MaxInFlight: deref(f.GroupCommit.MaxInFlight, 4), StallAfter: durOr(f.GroupCommit.StallAfter, 20*time.Millisecond)},
		ReplayCache: ReplayCache{MaxEntries: deref(f.ReplayCache.MaxEntries, 16384), TTL: durOr(f.ReplayCache.TTL, 5*time.Minute)},
		Relay: Relay{
			Enabled:      deref(f.Relay.Enabled, true),
			PollInterval: durOr(f.Relay.PollInterval, time.Second),
			Batch:        deref(f.Relay.Batch, 256),
			Lease:        durOr(f.Relay.Lease, 30*time.Second),
			BackoffBase:  durOr(f.Relay.BackoffBase, 250*time.Millisecond),
			BackoffMax:   durOr(f.Relay.BackoffMax, time.Minute),
			KeepSettled:  durOr(f.Relay.KeepSettled, 168*time.Hour),
			ReoweWindow:  durOr(f.Relay.ReoweWindow, 15*time.Minute),
		},
		Reconcile:  f.Reconcile.withDefaults(),
		RangeMoves: f.RangeMoves.withDefaults(),
		HTTP: HTTP{
			ReadHeaderTimeout: durOr(f.HTTP.ReadHeaderTimeout, 5*time.Second),
			ReadTimeout:       durOr(f.HTTP.ReadTimeout, 15*time.Second),
			WriteTimeout:      durOr(f.HTTP.WriteTimeout, 30*time.Second),
			IdleTimeout:       durOr(f.HTTP.IdleTimeout, 90*time.Second),
			MaxHeaderBytes:    deref(f.HTTP.MaxHeaderBytes, 16<<10),
		},
		TLS:   TLS{CertFile: rel(path, f.TLS.CertFile), KeyFile: rel(path, f.TLS.KeyFile), ClientCAFile: rel(path, f.TLS.ClientCAFile)},
		Admin: Admin{Listen: f.Admin.Listen},
	}
	c.Buffering = f.Buffering.withDefaults(c.ShardPool.RequestTimeout)
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	switch iv := deref(f.Idempotency.PartitionInterval, "24h"); iv {
	case "24h", "daily":
		c.Idempotency.PartitionInterval = partition.Daily
	case "monthly":
		c.Idempotency.PartitionInterval = partition.Monthly
	default:
		bad("idempotency.partition_interval: %q is not supported; use 24h (daily partitions idempotency_record_YYYY_MM_DD) or monthly (idempotency_record_YYYY_MM)", iv)
	}
	switch {
	case c.Auth.Mode == "tokens":
		c.Auth.Clients, problems = clients(f, problems)
	case len(f.Auth.Clients) > 0:
		bad("auth.clients: given with mode %s; remove them or set mode: tokens", c.Auth.Mode)
	}
	if f.Admin.TokenSHA256 != "" {
		if sum, ok := sha256Hex(f.Admin.TokenSHA256); ok {
			c.Admin.TokenSHA256 = &sum
		} else {
			bad("admin.token_sha256: must be 64 hex digits, the SHA-256 of the admin token")
		}
	}
	return c, problems
}

// clients converts auth.clients, reporting bad names, duplicates and malformed hashes.
func clients(f *file, problems []string) ([]Client, []string) {
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	var out []Client
	seen := map[string]bool{}
	for i, cl := range f.Auth.Clients {
		if !clientName.MatchString(cl.Name) {
			bad("auth.clients[%d].name: %q must be 1-63 of a-z 0-9 . _ - (it becomes part of idempotency scopes)", i, cl.Name)
		}
		if seen[cl.Name] {
			bad("auth.clients[%d].name: %q is listed twice", i, cl.Name)
		}
		seen[cl.Name] = true
		sum, ok := sha256Hex(cl.TokenSHA256)
		if !ok {
			bad("auth.clients[%d].token_sha256: must be 64 hex digits, the SHA-256 of the token (router token new --name NAME prints a token and its line)", i)
			continue
		}
		out = append(out, Client{Name: cl.Name, TokenSHA256: sum})
	}
	return out, problems
}

func sha256Hex(s string) ([32]byte, bool) {
	sum, err := hex.DecodeString(s)
	if err != nil || len(sum) != 32 {
		return [32]byte{}, false
	}
	return [32]byte(sum), true
}

// validate reports every setting outside what is safe to run.
func (c *Config) validate() []string {
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if c.Listen == "" {
		bad("listen: must be host:port, e.g. 127.0.0.1:8080")
	}
	if c.ShardmapPath == "" {
		bad("shardmap: must name the shard map file")
	}
	problems = append(problems, c.Idempotency.validate()...)
	switch c.Auth.Mode {
	case "none":
	case "tokens":
		if len(c.Auth.Clients) == 0 {
			bad("auth.clients: mode tokens needs at least one client (name, token_sha256): create one with router token new --name NAME, or for a local try set auth.mode: none")
		}
	default:
		bad("auth.mode: %q must be tokens or none", c.Auth.Mode)
	}
	if !currency.MatchString(c.Transfers.DefaultCurrency) {
		bad("transfers.default_currency: %q must be an ISO 4217 code such as EUR", c.Transfers.DefaultCurrency)
	}
	if c.Transfers.MaxBodyBytes < 256 || c.Transfers.MaxBodyBytes > 1<<20 {
		bad("transfers.max_body_bytes: %d must be between 256 and 1048576", c.Transfers.MaxBodyBytes)
	}
	problems = append(problems, c.ShardPool.validate()...)
	if rc := c.ReplayCache; rc.MaxEntries < 0 || rc.MaxEntries > 10_000_000 {
		bad("replay_cache.max_entries: %d must be between 0 (off) and 10000000", rc.MaxEntries)
	} else if rc.MaxEntries > 0 && (rc.TTL <= 0 || rc.TTL >= c.Idempotency.ReplayWindow) {
		bad("replay_cache.ttl: %s must be positive and below idempotency.replay_window (%s), so that no cached replay outlives retention", rc.TTL, c.Idempotency.ReplayWindow)
	}
	problems = append(problems, c.GroupCommit.validate(c.ShardPool)...)
	problems = append(problems, c.Relay.validate(c.ShardPool.RequestTimeout)...)
	problems = append(problems, c.Reconcile.validate()...)
	problems = append(problems, c.Buffering.validate(c.ShardPool)...)
	problems = append(problems, c.RangeMoves.validate()...)
	return append(problems, c.validateListeners()...)
}

// rel resolves a file named in router.yaml relative to router.yaml's directory.
func rel(configPath, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(configPath), p)
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func durOr(d *duration, def time.Duration) time.Duration {
	if d == nil {
		return def
	}
	return d.Duration
}
