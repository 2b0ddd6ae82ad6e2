package bench

import (
	"encoding/json"
	"net/http"

	"github.com/shardgate/shardgate/router"
	"github.com/shardgate/shardgate/shardmap"
)

// floorInput is POST /transfers' body as a bare handler decodes it.
type floorInput struct {
	Src       int64  `json:"src"`
	Dst       int64  `json:"dst"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
	Reference string `json:"reference"`
}

// floorView is the body the router answers a new transfer with; setup's probe checks that the
// floor's answer and the router's are the same bytes.
type floorView struct {
	ID        string `json:"id"`
	Src       int64  `json:"src"`
	Dst       int64  `json:"dst"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
	Reference string `json:"reference,omitempty"`
}

// floorHandler serves POST /transfers as a bare net/http handler: it decodes the body with
// encoding/json and writes the 201 the router would (Content-Type, Location and body), without
// validation, idempotency or a database. It is what HTTP, JSON and the load generator cost here.
func floorHandler(defaultCurrency string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /transfers", func(w http.ResponseWriter, r *http.Request) {
		var in floorInput
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if in.Currency == "" {
			in.Currency = defaultCurrency
		}
		id := router.TransferID(shardmap.KeyspaceID(in.Src), scope, r.Header.Get("Idempotency-Key"))
		body, err := json.Marshal(floorView{ID: id, Src: in.Src, Dst: in.Dst, Amount: in.Amount, Currency: in.Currency, Reference: in.Reference})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Location", "/transfers/"+id)
		w.WriteHeader(http.StatusCreated)
		w.Write(append(body, '\n')) //nolint:errcheck // the load generator reports a short answer
	})
	return mux
}
