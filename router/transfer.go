package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// operation is the idempotency scope's operation part: scope = client + ":" + operation.
const operation = "transfer"

// maxKeyClockSkew is how far in the future a UUIDv7 key's timestamp may be before the key is
// refused as invalid: client clocks drift, but not by more than this.
const maxKeyClockSkew = time.Minute

// admitted is a POST /transfers request that passed every check the router makes on its own.
type admitted struct {
	client, key string
	in          TransferInput
}

// rejection is the answer to a request refused before any shard is involved; nothing is stored.
type rejection struct {
	pt      problemType
	detail  string
	outcome string // the label of shardgate_transfers_total
}

// rejected is the usual rejection: a client error, counted as outRejected.
func rejected(pt problemType, detail string) *rejection {
	return &rejection{pt: pt, detail: detail, outcome: outRejected}
}

// postTransfer serves POST /transfers: the checks the router can make alone, then the shard.
func (s *Server) postTransfer(w http.ResponseWriter, r *http.Request) {
	a, rej := s.admit(w, r)
	if rej == nil {
		rej = s.checkKeyAge(a.key, time.Now())
	}
	if rej != nil {
		if rej.pt == probUnauthorized {
			challenge(w, clientRealm)
		}
		s.metrics.transfers.WithLabelValues(rej.outcome, "").Inc()
		writeProblem(w, rej.pt, rej.detail, 0)
		return
	}
	s.route(w, r, s.buildRequest(r, a))
}

// admit authenticates the client and reads the Idempotency-Key and the body, or says why not.
func (s *Server) admit(w http.ResponseWriter, r *http.Request) (admitted, *rejection) {
	client, err := s.authenticate(r)
	if err != nil {
		return admitted{}, rejected(probUnauthorized, err.Error())
	}
	key, rej := idempotencyKey(r.Header)
	if rej != nil {
		return admitted{}, rej
	}
	if rej := checkMediaType(r.Header.Get("Content-Type")); rej != nil {
		return admitted{}, rej
	}
	body, rej := s.readBody(w, r)
	if rej != nil {
		return admitted{}, rej
	}
	in, err := DecodeTransfer(body, s.cfg.Transfers.DefaultCurrency)
	if err != nil {
		return admitted{}, rejected(probInvalidBody, err.Error())
	}
	return admitted{client: client, key: key, in: in}, nil
}

// idempotencyKey reads the request's one Idempotency-Key header.
func idempotencyKey(h http.Header) (string, *rejection) {
	keys := h.Values("Idempotency-Key")
	switch {
	case len(keys) == 0:
		return "", rejected(probMissingKey, "send an Idempotency-Key header generated once per operation and reused on every retry")
	case len(keys) > 1:
		return "", rejected(probInvalidKey, "send exactly one Idempotency-Key header")
	}
	key, err := ParseIdempotencyKey(keys[0])
	if err != nil {
		return "", rejected(probInvalidKey, err.Error())
	}
	return key, nil
}

// checkMediaType accepts a body sent as application/json, or with no Content-Type at all, only
// as UTF-8: with no charset or charset=utf-8, in any case. JSON exchanged between systems is
// UTF-8 (RFC 8259 §8.1), and a body declared in another charset would be read as text the
// client did not mean, so it is refused rather than guessed at.
func checkMediaType(contentType string) *rejection {
	switch contentType {
	case "", "application/json", "application/json; charset=utf-8":
		return nil // what clients send, accepted without parsing (which allocates)
	}
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "application/json" {
		return rejected(probMediaType, "send Content-Type: application/json")
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return rejected(probMediaType, fmt.Sprintf("the body must be UTF-8 JSON, not charset %s; send Content-Type: application/json or application/json; charset=utf-8", quote(cs)))
	}
	return nil
}

// readBody reads the whole body before anything parses it, so that a body over
// transfers.max_body_bytes is 413 whatever it holds: a JSON error early in a body that is also
// too large must not win. A Content-Length over the limit is refused without reading a byte,
// which also answers Expect: 100-continue with the 413 instead of inviting the body (net/http
// sends 100 Continue only on the first read); a body of unannounced length is read to one byte
// past the limit at most.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *rejection) {
	limit := s.cfg.Transfers.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		return nil, tooLarge(limit)
	}
	if err != nil {
		return nil, rejected(probInvalidBody, fmt.Sprintf("the body could not be read to its end (%v); send it again", err))
	}
	return body, nil
}

// tooLarge refuses a body over limit bytes.
func tooLarge(limit int64) *rejection {
	return rejected(probTooLarge, fmt.Sprintf("the body is over %d bytes, the most this router accepts", limit))
}

// checkKeyAge refuses a UUIDv7 key from the future or older than retention. A UUIDv7 key carries
// its creation time: one older than retention may have had its record dropped already, so it is
// refused rather than risk executing it a second time. Any other key's age is the shard's call.
func (s *Server) checkKeyAge(key string, now time.Time) *rejection {
	created, ok := keyTime(key)
	switch {
	case !ok:
		return nil
	case created.After(now.Add(maxKeyClockSkew)):
		return rejected(probInvalidKey, fmt.Sprintf("the key is a UUIDv7 from the future (%s); generate keys with a correct clock", created.UTC().Format(time.RFC3339)))
	case created.Before(now.Add(-s.cfg.Idempotency.Retention)):
		return &rejection{pt: probKeyExpired, outcome: outKeyExpired,
			detail: fmt.Sprintf("the key was created %s, longer ago than the retention of %s; it will not be executed", created.UTC().Format(time.RFC3339), s.cfg.Idempotency.Retention)}
	}
	return nil
}

// buildRequest makes the shard's request, including the complete 201 response: the transfer id
// is derived from the key, so what the shard stores is exactly what is sent.
func (s *Server) buildRequest(r *http.Request, a admitted) idem.TransferRequest {
	in := a.in
	scope := a.client + ":" + operation
	ksid := shardmap.KeyspaceID(in.Src)
	id := TransferID(ksid, scope, a.key)
	return idem.TransferRequest{
		Scope: scope, Key: a.key, RequestHash: Fingerprint(r.Method, r.URL.Path, in),
		KeyspaceID: ksid, DstKeyspaceID: shardmap.KeyspaceID(in.Dst), TransferID: id, Client: a.client,
		Src: in.Src, Dst: in.Dst, Amount: in.Amount, Currency: in.Currency, Reference: in.Reference,
		Retention: s.cfg.Idempotency.Retention,
		Response: idem.Response{
			Status:  http.StatusCreated,
			Headers: map[string]string{"Content-Type": "application/json", "Location": "/transfers/" + id},
			Body:    transferBody(id, in),
		},
	}
}

// transferBody is the 201 body of the transfer id: json.Marshal of its transferView (which has no
// created_at and no credit yet) and a newline, built in one buffer.
func transferBody(id string, in TransferInput) string {
	var buf [512]byte
	b := append(buf[:0], `{"id":`...)
	b = appendJSONString(b, id)
	b = append(b, ',')
	b = appendTransferFields(b, in)
	b = append(b, "}\n"...)
	return string(b)
}

// route runs req on the shard that owns it, answers, and counts the outcome. A shard that says
// this router's map is older than its own makes the router reload and route once more. A
// request for a key range that is moving (its owner refuses it) is held until a shard takes
// the range, within the bounds of buffering (holdFenced).
func (s *Server) route(w http.ResponseWriter, r *http.Request, req idem.TransferRequest) {
	// The transfer runs to its end even if the client hangs up: the outcome is then stored for the
	// retry to replay, instead of being cut off at an unknown point.
	if resp, ok := s.replays.get(req.Scope, req.Key, req.RequestHash); ok {
		shard, _ := s.topo.Load().Map.ShardFor(req.KeyspaceID)
		writeStored(w, resp, true)
		s.metrics.transfers.WithLabelValues(outReplayed, shard.Name).Inc()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.ShardPool.RequestTimeout)
	defer cancel()
	var a attempt
	if s.fenced(req) {
		a = s.holdFenced(ctx, r.Context(), req, nil)
	} else if a = s.tryOnce(ctx, req); a.refused() && s.buffer != nil {
		a = s.holdFenced(ctx, r.Context(), req, &a)
	}
	s.metrics.transfers.WithLabelValues(s.answer(w, a.shard, a.version, req, a.res, a.err), a.shard).Inc()
}

// transferAt runs req on shard, one of topo's, and records the shard's latency.
func (s *Server) transferAt(ctx context.Context, topo *topology.Topology, shard *shardmap.Shard, req idem.TransferRequest) (string, idem.TransferResult, error) {
	conn := topo.Shard(shard.Name)
	if err := conn.Enter(); err != nil {
		return shard.Name, idem.TransferResult{}, err
	}
	defer conn.Leave()
	start := time.Now()
	res, err := s.groups.transfer(ctx, shard.Name, conn, req)
	if err == nil && needsConfirm(res.Outcome) {
		// The record was found, not written, by this call: it may be a commit whose wait for the
		// synchronous standby was cancelled, visible here but missing on the standby. A commit
		// made now that waits for the standby covers it.
		err = conn.ConfirmReplicated(ctx)
	}
	if err == nil {
		s.replays.remember(shard.Name, req, res)
		if s.owed != nil && owesCredit(topo, shard, req, res) {
			s.owed(shard.Name, req)
		}
	}
	outcome := string(res.Outcome)
	if err != nil {
		outcome = "error"
	}
	s.metrics.shardTime.WithLabelValues(shard.Name, outcome).Observe(time.Since(start).Seconds())
	return shard.Name, res, err
}

// owesCredit reports whether res, shard's answer to the debit req, may leave a credit owed that
// this router is to deliver: a debit applied with its credit owed, or one replayed from the
// shard whose destination another shard owns. The latter is a retry after an answer that never
// came (a timeout, a failover): the first attempt's owed credit, leased to this router, was
// never handed off. Delivering it again replays on the destination, so nothing is credited twice.
func owesCredit(topo *topology.Topology, shard *shardmap.Shard, req idem.TransferRequest, res idem.TransferResult) bool {
	switch res.Outcome {
	case idem.Applied:
		return !res.CreditSettled
	case idem.Replayed:
		dst, _ := topo.Map.ShardFor(req.DstKeyspaceID)
		return dst.Name != shard.Name
	}
	return false
}

// needsConfirm reports the outcomes that answer from a record the shard already held, which
// are final for the client: on a shard with synchronous standbys they are sent only once that
// record is known to be on the standbys.
func needsConfirm(o idem.Outcome) bool {
	return o == idem.Replayed || o == idem.KeyReused || o == idem.Expired
}

// ReloadAtLeast reloads the shard map unless another request already did, and reports whether
// the serving version is now at least version.
func (s *Server) ReloadAtLeast(version int64) bool {
	if s.topo.Load().Map.Version < version {
		s.Reload(s.cfg.ShardmapPath) //nolint:errcheck // Reload logs and counts its result
	}
	return s.topo.Load().Map.Version >= version
}

// answer writes the response for a shard's result for req and returns the outcome label.
func (s *Server) answer(w http.ResponseWriter, shard string, version int64, req idem.TransferRequest, res idem.TransferResult, err error) string {
	if err != nil {
		return s.shardFailure(w, shard, err, retrySameKey)
	}
	switch res.Outcome {
	case idem.Applied:
		writeStored(w, res.Response, false)
		return outApplied
	case idem.Replayed:
		writeStored(w, res.Response, true)
		return outReplayed
	case idem.InProgress:
		writeProblem(w, probInProgress, "the first attempt with this key has not finished; retry after the indicated delay", s.cfg.Idempotency.InProgressRetryAfter)
		return outInProgress
	case idem.KeyReused:
		writeProblem(w, probKeyReused, "this Idempotency-Key was first used with a different request body; generate a new key for a new operation", 0)
		return outKeyReused
	case idem.Expired:
		writeProblem(w, probKeyExpired, "this key's transfer was applied earlier and its idempotency record has expired; it will not be applied again", 0)
		return outKeyExpired
	case idem.RecordMissing:
		s.recordMissing(w, shard, req)
		return outRecordMissing
	case idem.NotOwner:
		s.log.Warn("shard refused a key range it does not own", "shard", shard, "router_map_version", version, "shard_map_version", res.ShardMapVersion)
		writeProblem(w, probStaleMap, "the owning shard is changing; retry with the same Idempotency-Key", s.cfg.ShardPool.RetryAfter)
		return outNotOwner
	}
	s.log.Error("unexpected transfer outcome", "shard", shard, "outcome", string(res.Outcome))
	writeProblem(w, probInternal, "", 0)
	return outError
}

// recordMissing answers a key whose transfer is in the shard's ledger, younger than retention,
// while its idempotency record is not to be found: someone removed it (detached today's
// partition, say). The stored response may come back, so this is no final "expired"; and the
// transfer was applied, so a new key would apply it twice. Hence a retryable 503 that says to keep
// the key, and an error in the log that an operator must act on. The token is in neither.
func (s *Server) recordMissing(w http.ResponseWriter, shard string, req idem.TransferRequest) {
	s.metrics.recordsMissing.WithLabelValues(shard).Inc()
	s.log.Error("IDEMPOTENCY RECORD MISSING: a transfer is in the shard's ledger but its idempotency record is gone; "+
		"was a partition of idempotency_record detached or a row deleted? Retries of this key get 503 until the record is back",
		"shard", shard, "scope", req.Scope, "key", req.Key, "transfer_id", req.TransferID, "retention", req.Retention)
	writeProblem(w, probRecordMissing, "the transfer was applied earlier, but its stored response cannot be read on its shard right now; "+
		"do not retry with a new Idempotency-Key (that would apply it again): retry later with the same key", s.cfg.ShardPool.RetryAfter)
}
