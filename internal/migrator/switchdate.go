package migrator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/restow/restow/internal/storedversions"
)

// Dating the last storage switch, so that a switch a release old needs no
// settle window.
//
// A CRD records no switch time. The evidence restow uses is the CRD's own
// managedFields: the newest time of the field managers that own a storage
// flag of spec.versions is at or after the last write that moved one
// (storedversions.LastStorageSwitch). That time is the API server's clock;
// restow reads the API server's clock (the Date of an answer) to count it
// on its own, so that a clock of restow's that runs ahead shortens nothing.
//
// The window guards writes that began on the old storage before an API
// server switched. A server switches when its informer sees the write,
// within informerLag of it where there is one server, and within the lag
// bound where there are several. So the window may count from that
// evidence, rather than from when the migration began, only where every
// API server is known to have switched before the migration looked: one
// server, by every signal that counts them (lag.go), or every counted
// server read at its own address and showing the target at the first read
// (switch.go). Anything else (a server that lags, one restow cannot see, no
// managedFields that date the switch, no clock read) leaves the window
// counted from the migration's own start, as before. The evidence only
// ever shortens a window: it never moves its end later.

// switchDate dates the last storage switch of crd, by restow's clock; nil
// when nothing dates it.
func (m *Migrator) switchDate(ctx context.Context, crd *apiextensionsv1.CustomResourceDefinition) *storedversions.SwitchEvidence {
	ev, ok := storedversions.LastStorageSwitch(crd)
	if !ok {
		return nil
	}
	ahead, err := m.clockAhead(ctx)
	if err != nil {
		klog.FromContext(ctx).V(1).Info("Cannot read the API server's clock: the settle window counts from the migration's start", "crd", crd.Name, "err", err)
		return nil
	}
	ev.At = ev.At.Add(ahead)
	return &ev
}

// clockAhead is how far restow's clock is ahead of the API server's, or
// more: the Date of an answer is truncated to the second and taken before
// the answer arrives, so that a time of the server's plus clockAhead is at
// or after the same moment by restow's clock.
func (m *Migrator) clockAhead(ctx context.Context) (time.Duration, error) {
	if m.Config == nil {
		return 0, errors.New("no client configuration")
	}
	hc, err := rest.HTTPClientFor(m.Config)
	if err != nil {
		return 0, err
	}
	base, _, err := rest.DefaultServerUrlFor(m.Config)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base.JoinPath("/version").String(), nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	now := time.Now()
	date, err := http.ParseTime(resp.Header.Get("Date"))
	if err != nil {
		return 0, fmt.Errorf("the answer's Date %q: %w", resp.Header.Get("Date"), err)
	}
	return now.Sub(date), nil
}

// settleFromSwitch counts the settle window from the dated last switch
// where seen says that every API server had switched before the migration
// looked (see above), and keeps the earlier end.
func (mg *migration) settleFromSwitch(seen bool) {
	crd := mg.target.CRD
	if !seen || crd == nil || crd.Switched == nil {
		return
	}
	lag := informerLag
	if mg.target.APIServers != 1 {
		lag = mg.m.lagBound()
	}
	end := crd.Switched.At.Add(lag + mg.opts.SettleWindow)
	mg.mu.Lock()
	defer mg.mu.Unlock()
	if end.Before(mg.settleUntil) {
		mg.settleUntil = end
		mg.settleFrom = crd.Switched.Source
	}
}

// oneServer reports whether the signals that count API servers agreed on
// one (lag.go), so that the one that answered Resolve is the only one: the
// same count that lets a first pass start informerLag after the switch.
func (t Target) oneServer() bool {
	return t.APIServers == 1 && t.LagWait == 0
}
