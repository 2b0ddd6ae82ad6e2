# shardgate — see README.md. `make test` is the whole test suite, as CI runs it.
GO ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

# A count, not a duration: with a duration, Go 1.26's fuzz coordinator can report its own
# deadline as a failure on a busy machine ("context deadline exceeded", no failing input;
# golang/go#75804, fixed in Go 1.27). 50000 inputs take about 5-20 s per target here.
FUZZTIME ?= 50000x

# The version that `make build` links into the router (router version, /healthz): the git tag,
# or what git describes of the checkout. `make release VERSION=vX.Y.Z` sets it.
VERSION ?= $(shell git describe --tags --match 'v[0-9]*' --always --dirty 2>/dev/null || echo devel)

.PHONY: test test-local test-quick deps lint cross unit fuzz containers bench bench-smoke bench-compare bench-compare-smoke build run release release-snapshot bench-move bench-move-smoke

## test: every check CI runs: lint, unit and integration tests with -race on local PostgreSQL
## processes, fuzzing, the benchmark smoke run, then the same suites on containers
test: test-local containers

## test-local: everything but the container suites (for machines without Docker)
test-local: deps lint release-snapshot unit fuzz bench-smoke bench-compare-smoke bench-move-smoke

## test-quick: the unit and storage tests only (real PostgreSQL as local processes), for the
## edit-test loop: no lint, race detector, fuzzing, benchmarks, integration suite or containers.
## It installs only PostgreSQL's server binaries when they are missing.
test-quick:
	./scripts/ensure-deps.sh run
	$(GO) test -short -count=1 -timeout 10m $$($(GO) list ./... | grep -v '/test/')

## containers: images from Debian packages, the suites on shard containers, compose smoke test
containers:
	./scripts/test-containers.sh

deps:
	./scripts/ensure-deps.sh

## lint: gofmt, go vet and staticcheck on both modules (the main one and the container
## backend's, shardgatetest/containers), and that go mod tidy would change neither
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed: $$out"; exit 1; fi
	$(GO) mod tidy -diff
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	cd shardgatetest/containers && $(GO) mod tidy -diff && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...

## cross: the router builds for Linux, macOS and Windows (router dev needs Linux and says so)
cross:
	GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 $(GO) build -o /dev/null ./cmd/router
	GOOS=windows GOARCH=amd64 CGO_ENABLED=0 $(GO) build -o /dev/null ./cmd/router
	GOOS=linux GOARCH=amd64 CGO_ENABLED=0 $(GO) build -o /dev/null ./cmd/router

unit:
	$(GO) test -race -count=1 -timeout 20m ./...

## fuzz: each fuzz target for FUZZTIME inputs (go test runs one -fuzz target per invocation)
fuzz:
	$(GO) test ./router -run '^$$' -fuzz '^FuzzDecodeTransfer$$' -fuzztime $(FUZZTIME)
	$(GO) test ./router -run '^$$' -fuzz '^FuzzParseIdempotencyKey$$' -fuzztime $(FUZZTIME)
	$(GO) test ./router -run '^$$' -fuzz '^FuzzPostTransfer$$' -fuzztime $(FUZZTIME)
	$(GO) test ./router -run '^$$' -fuzz '^FuzzScanPlainTransfer$$' -fuzztime $(FUZZTIME)
	$(GO) test ./router -run '^$$' -fuzz '^FuzzTransferEncoding$$' -fuzztime $(FUZZTIME)
	$(GO) test ./router -run '^$$' -fuzz '^FuzzProblemBody$$' -fuzztime $(FUZZTIME)
	$(GO) test ./shardmap -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME)
	$(GO) test ./config -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME)

## bench: one table of transfers/s at concurrency 1, 8, 64 and 256: the anchor CTE and the
## router's function under pgbench, the router on new keys (src and dst on one shard, and on two)
## and replays, a bare net/http floor, and a hand-written one-database peer; latencies, the
## cross-shard time to credit and commits per transfer; and the router's latency with group
## commit on and off (see docs/performance.md)
bench: deps
	$(GO) test ./test/bench -run '^$$' -bench . -benchtime 1x -timeout 20m

## bench-smoke: the same phases at concurrency 1 and 8 for 1 s each, every phase checking its rows
bench-smoke: deps
	$(GO) test ./test/bench -run '^$$' -bench . -benchtime 1x -timeout 10m -args -bench.duration 1s -bench.concurrency 1,8

## bench-compare: new keys through the router at BASE (a git revision) and at HEAD (default: the
## working tree) side by side under wrk, with the anchor CTE between them, three rounds at
## concurrency 1, 8 and 64 (about 6 minutes; scripts/bench-compare.sh takes -r, -d and -c).
## BASE_CONF and HEAD_CONF add router.yaml settings to a side, e.g. HEAD_CONF='group_commit: {in_flight: 2}';
## AGED=29 starts both databases as ones that have run 29 days (the partitions of the default retention).
## The recipe reads them from its environment (make exports variables given on its command line),
## so that YAML with quotes in it reaches the script as written.
bench-compare:
	@[ -n "$(BASE)" ] || { echo "usage: make bench-compare BASE=<git revision> [HEAD=<git revision>] [BASE_CONF=<yaml>] [HEAD_CONF=<yaml>] [AGED=<days>]" >&2; exit 2; }
	./scripts/bench-compare.sh -a "$${AGED:-0}" -B "$$BASE_CONF" -H "$$HEAD_CONF" "$$BASE" $${HEAD:+"$$HEAD"}

## bench-compare-smoke: the script, one short round of HEAD against the working tree on aged
## databases, so that it keeps working (its row checks included)
bench-compare-smoke:
	./scripts/bench-compare.sh -r 1 -d 1 -c 1,8 -a 3 HEAD

## bench-move: move a key range of S transfers (SIZES, default 10000 100000) between two local
## shards (a PostgreSQL server each, fsync on) under load through a router (8 HTTP clients at 50
## transfers/s), with `router shardmap apply --map` as a process of its own, printing apply time,
## rows/s, the moving and other ranges' longest time without a 201, their non-201 answers and
## p99, then checking every row; PACE sets the apply's pace (rangemove.DefaultPace unless set)
## (scripts/bench-move.sh takes -c, -r, -p and -s)
bench-move: deps
	./scripts/bench-move.sh $(if $(PACE),-p $(PACE)) $(SIZES)

## bench-move-smoke: the range-move bench at 2,000 transfers with 2 s before the move, so that
## it keeps working (its row checks included)
bench-move-smoke: deps
	SHARDGATE_BENCH_MOVE_BEFORE=2s ./scripts/bench-move.sh 2000

build:
	CGO_ENABLED=0 $(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/router ./cmd/router

## release: the release VERSION=vX.Y.Z of the tagged, checked-out commit (docs/releases.md): the
## router for Linux, macOS and Windows in dist/, SHA256SUMS, and both images with version labels
release:
	@case "$(origin VERSION)" in command*|environment*) ;; *) echo "usage: make release VERSION=vX.Y.Z" >&2; exit 2 ;; esac
	GO=$(GO) ./scripts/release.sh "$(VERSION)"

## release-snapshot: the same binaries and checks for the working tree under a snapshot version,
## without images (make test runs it)
release-snapshot:
	GO=$(GO) ./scripts/release.sh --snapshot

## run: the local sandbox (PostgreSQL shards as local processes, migrated, router on :8080).
## It needs only PostgreSQL's server binaries. The built router runs in the recipe's place
## (exec), so Ctrl-C reaches it alone and a clean stop is a clean exit.
run: build
	./scripts/ensure-deps.sh run
	exec ./bin/router dev $(ARGS)
