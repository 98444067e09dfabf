package sweep_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/inflight-go/inflight/registry"
	"github.com/inflight-go/inflight/slots"
	"github.com/inflight-go/inflight/sweep"
)

func ExampleHandler() {
	mock := clock.NewMock()
	reg := registry.New[string](8, slots.WithClock(mock))
	s, _ := reg.TryAcquire("org-a/glm-5")
	defer s.Release()
	mock.Add(90 * time.Second)

	// Mount it behind the operators' access control: keys name tenants.
	h := sweep.Handler(reg, sweep.WithClock(mock))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/slots", nil))
	var out sweep.HoldersJSON
	_ = json.Unmarshal(rec.Body.Bytes(), &out)
	fmt.Println("in use:", out.InUse, "threshold:", out.ThresholdSeconds, "s")
	for _, h := range out.Holders {
		fmt.Println(h.Key, h.AgeSeconds, "s", h.LongHeld)
	}
	// Output:
	// in use: 1 threshold: 1800 s
	// org-a/glm-5 90 s false
}
