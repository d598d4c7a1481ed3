package frontdoor_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemstream/idemstream/dedupe/memstore"
	"github.com/idemstream/idemstream/frontdoor"
	"github.com/idemstream/idemstream/schemas"
)

// A Go service guards its claim handler with a route of its configuration
// file: a retry with a new client_time gets the first answer, a changed
// amount is refused with the pointer that differs.
func ExampleGuard_Wrap() {
	cfg, err := schemas.Parse([]byte(`
store: {kind: memory}
http:
  routes:
    - name: coupon-claim
      path: /api/coupon/claim
      volatile: [/client_time]
`), "")
	if err != nil {
		panic(err)
	}
	guard, err := frontdoor.NewGuard(cfg, cfg.HTTP.Routes[0], memstore.New(), frontdoor.Options{})
	if err != nil {
		panic(err)
	}
	claims := 0
	claim := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		claims++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"coupon_no":%d}`, claims)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /api/coupon/claim", guard.Wrap(claim))

	send := func(body string) {
		r := httptest.NewRequest(http.MethodPost, "/api/coupon/claim", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("Idempotent-Replayed"), strings.TrimSpace(w.Body.String()))
	}
	send(`{"user":"u-1","amount":50,"client_time":"12:00:00"}`)
	send(`{"user":"u-1","amount":50,"client_time":"12:00:05"}`) // a retry
	send(`{"user":"u-1","amount":500,"client_time":"12:00:09"}`)
	fmt.Println("claims:", claims)
	// Output:
	// 201  {"coupon_no":1}
	// 201 true {"coupon_no":1}
	// 422  {"type":"https://idemstream.dev/problems/idempotency-key-conflict","title":"Idempotency key reused with another body","status":422,"detail":"this key was first sent with another body (fields a retry may change are ignored); send a new key for a new request","code":"IDEMPOTENCY_KEY_CONFLICT","conflict_paths":["/amount"]}
	// claims: 1
}
