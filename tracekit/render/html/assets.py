"""The HTML report's inline stylesheet and scripts, kept as string constants.

Constants rather than package-data files so the report stays one self-contained string with
nothing to locate at run time. No trace data ever goes into these: the scripts read the page
through the DOM (``data-*`` attributes the renderer escaped), so nothing is embedded in
``<script>``.
"""

from __future__ import annotations

#: Light palette first, dark palette under ``prefers-color-scheme``; charts use the variables.
CSS = """
:root{
  --bg:#fbfbfa;--fg:#1f2328;--muted:#656d76;--faint:#8c959f;--line:#d8dee4;--card:#ffffff;
  --code-bg:#f3f4f6;--accent:#0b6bcb;--ok:#1a7f37;--warn:#9a6700;--bad:#cf222e;
  --sev-high:#cf222e;--sev-medium:#bf8700;--sev-low:#57606a;
  --c-cpu_on_loop:#e03e1a;--c-cpu_off_loop:#f2a33a;--c-model_wait:#2f74d0;
  --c-io_wait:#1f9e89;--c-loop_wait:#9b4dca;
  --k-tokenize:#7950f2;--k-guardrail:#e8590c;--k-model:#2f74d0;--k-serialize:#12a37f;
  --k-other:#868e96;--k-request:#5c636a;--k-server:#5c636a;--k-client:#1098ad;
    --k-internal:#868e96;
  --before:#aab2bb;--after:#2da44e;--lane:#eef1f4;--lane-hl:#dbe8fb;
}
@media (prefers-color-scheme: dark){
  :root{
    --bg:#0f1216;--fg:#e6e8eb;--muted:#9aa4ae;--faint:#6e7781;--line:#2d333b;--card:#161b22;
    --code-bg:#1c2128;--accent:#58a6ff;--ok:#3fb950;--warn:#d29922;--bad:#f85149;
    --sev-high:#f85149;--sev-medium:#d29922;--sev-low:#8b949e;
    --c-cpu_on_loop:#ff6a47;--c-cpu_off_loop:#f5b04f;--c-model_wait:#4c8fe8;
    --c-io_wait:#2bb59d;--c-loop_wait:#b87ae0;
    --k-tokenize:#9775fa;--k-guardrail:#ff7b2e;--k-model:#4c8fe8;--k-serialize:#20c997;
    --k-other:#8b949e;--k-request:#8b949e;--k-server:#8b949e;--k-client:#22b8cf;
      --k-internal:#8b949e;
    --before:#545d68;--after:#3fb950;--lane:#1b2027;--lane-hl:#1f3350;
  }
}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;background:var(--bg);color:var(--fg);
  font:15px/1.55 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1200px;margin:0 auto;padding:28px 28px 64px}
h1{font-size:26px;margin:0 0 4px;letter-spacing:-.01em}
h2{font-size:19px;margin:40px 0 12px;padding-bottom:6px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:22px 0 8px}
p{margin:6px 0}
code,pre,.mono{
  font-family:ui-monospace,SFMono-Regular,"SF Mono",Menlo,Consolas,"Liberation Mono",monospace;
  font-size:13px}
pre{background:var(--code-bg);border:1px solid var(--line);border-radius:6px;padding:10px 12px;
  overflow-x:auto;margin:8px 0}
.muted{color:var(--muted)}
.note{color:var(--muted);font-size:14px}
nav{margin:10px 0 0;font-size:14px}
nav a{color:var(--accent);text-decoration:none;margin-right:14px}
nav a:hover{text-decoration:underline}
.meta{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:10px;
  margin:18px 0 0}
.meta div{background:var(--card);border:1px solid var(--line);border-radius:8px;
  padding:8px 12px}
.meta dt{font-size:12px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.meta dd{margin:2px 0 0;font-weight:600;overflow-wrap:anywhere}
.meta dd .muted{font-weight:400;font-size:13px}
.status-ok{color:var(--ok)}.status-warn{color:var(--warn)}.status-none{color:var(--muted)}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:14px 18px;
  margin:12px 0}
.finding header{display:flex;flex-wrap:wrap;align-items:baseline;gap:10px}
.finding .rule{font-weight:700}
.finding .where{color:var(--muted);font-size:14px;overflow-wrap:anywhere}
.badge{display:inline-block;border-radius:999px;padding:1px 10px;font-size:12px;font-weight:700;
  text-transform:uppercase;letter-spacing:.05em;color:#fff}
.sev-high{background:var(--sev-high)}.sev-medium{background:var(--sev-medium)}
  .sev-low{background:var(--sev-low)}
.impact{margin-left:auto;font-variant-numeric:tabular-nums;color:var(--muted);font-size:14px}
.fix-title{font-weight:600;margin-top:10px}
.proj{display:grid;grid-template-columns:110px 1fr 210px;gap:4px 12px;align-items:center;
  margin-top:10px;max-width:720px}
.proj .lbl{font-size:13px;color:var(--muted)}
.proj .bars{display:flex;flex-direction:column;gap:2px}
.proj .bar{height:8px;border-radius:2px;min-width:2px}
.proj .b{background:var(--before)}.proj .a{background:var(--after)}
.proj .val{font-size:13px;font-variant-numeric:tabular-nums}
.gain{color:var(--ok);font-weight:600}.loss{color:var(--bad);font-weight:600}
table{border-collapse:collapse;width:100%;font-size:14px;font-variant-numeric:tabular-nums}
th,td{padding:5px 10px;border-bottom:1px solid var(--line);text-align:right;vertical-align:top}
th{font-size:12px;color:var(--muted);font-weight:600;text-transform:uppercase;
  letter-spacing:.03em}
th:first-child,td:first-child,td.l,th.l{text-align:left}
td.route{overflow-wrap:anywhere;max-width:380px}
.tablewrap{overflow-x:auto}
.legend{display:flex;flex-wrap:wrap;gap:6px 16px;font-size:13px;color:var(--muted);
  margin:6px 0 10px}
.legend span{display:inline-flex;align-items:center;gap:6px}
.sw{display:inline-block;width:12px;height:12px;border-radius:2px}
.sw.hatch{background:repeating-linear-gradient(135deg,var(--c-loop_wait) 0 2px,transparent 2px 5px);
  outline:1px solid var(--c-loop_wait)}
.sw.wait-sw{background:var(--k-model);opacity:.35}
.sw.outline{outline:1px solid var(--faint);background:transparent}
.sw.life{height:2px;background:var(--faint)}
svg text{fill:var(--fg);font-size:12px}
svg text.dim{fill:var(--muted);font-size:11px}
svg text.in{fill:#fff;font-size:11px}
svg .grid{stroke:var(--line);stroke-width:1}
svg .life{stroke:var(--faint);stroke-width:1}
svg .lanebg{fill:transparent}
svg .hl .lanebg,svg .lanebg.hl{fill:var(--lane-hl)}
svg .rest{fill:transparent;stroke:var(--faint);stroke-width:1}
svg .wait{fill-opacity:.35}
svg .lw{fill:url(#tk-hatch);stroke:var(--c-loop_wait);stroke-width:1}
.c-cpu_on_loop{fill:var(--c-cpu_on_loop);background:var(--c-cpu_on_loop)}
.c-cpu_off_loop{fill:var(--c-cpu_off_loop);background:var(--c-cpu_off_loop)}
.c-model_wait{fill:var(--c-model_wait);background:var(--c-model_wait)}
.c-io_wait{fill:var(--c-io_wait);background:var(--c-io_wait)}
.c-loop_wait{fill:var(--c-loop_wait);background:var(--c-loop_wait)}
.k-tokenize{fill:var(--k-tokenize);background:var(--k-tokenize)}
.k-guardrail{fill:var(--k-guardrail);background:var(--k-guardrail)}
.k-model{fill:var(--k-model);background:var(--k-model)}
.k-serialize{fill:var(--k-serialize);background:var(--k-serialize)}
.k-other{fill:var(--k-other);background:var(--k-other)}
.k-request{fill:var(--k-request);background:var(--k-request)}
.k-server{fill:var(--k-server);background:var(--k-server)}
.k-client{fill:var(--k-client);background:var(--k-client)}
.k-internal{fill:var(--k-internal);background:var(--k-internal)}
#tk-hatch line{stroke:var(--c-loop_wait);stroke-width:1.5}
.chart{overflow-x:auto}
.timeline{display:flex;border:1px solid var(--line);border-radius:8px;background:var(--card);
  overflow:hidden}
.timeline .labels{flex:none;border-right:1px solid var(--line)}
.timeline .scroll{flex:1;overflow-x:auto}
.tl-tools{display:flex;gap:8px;align-items:center;font-size:13px;color:var(--muted);
  margin:8px 0}
.tl-tools button{font:inherit;color:var(--fg);background:var(--card);
  border:1px solid var(--line);border-radius:6px;padding:2px 10px;cursor:pointer}
.empty{border:1px dashed var(--line);border-radius:8px;padding:14px 18px;color:var(--muted)}
footer{margin-top:48px;font-size:12px;color:var(--faint)}
"""

#: Runs first, in <head>: records script errors, failed resource loads, unhandled rejections,
#: Content-Security-Policy violations and console.error calls on ``<html data-errors="N"
#: data-error-log="...">``, so a headless browser test can read them back from the dumped DOM.
JS_ERROR_HOOK = """
(function(){
  var d=document.documentElement,log=[];
  function rec(m){log.push(String(m).slice(0,300));d.setAttribute('data-errors',String(log.length));
    d.setAttribute('data-error-log',log.join(' | '));}
  d.setAttribute('data-errors','0');
  window.addEventListener('error',function(e){
    var t=e.target;
    rec(t&&t!==window&&t.tagName?('failed to load <'+t.tagName.toLowerCase()+'>')
      :(e.message||'error'));
  },true);
  window.addEventListener('unhandledrejection',function(e){
    rec('unhandled rejection: '+(e.reason&&e.reason.message?e.reason.message:e.reason));});
  document.addEventListener('securitypolicyviolation',function(e){
    rec('blocked by the page policy: '+e.violatedDirective);});
  var ce=console.error;console.error=function(){rec(Array.prototype.join.call(arguments,' '));
    return ce.apply(console,arguments);};
})();
"""

#: Runs at the end of <body>: lane highlighting and horizontal zoom for the loop timeline
#: (buttons, or ``#zoom=N`` in the URL).
#: The timeline is complete without it (rendered server-side); this only adds interaction.
JS_INTERACTIVE = """
(function(){
  var root=document.getElementById('loop-timeline');
  if(root){
    var svg=root.querySelector('svg.tl-data'),base=svg?parseFloat(svg.getAttribute('width')):0;
    var scaled=svg?Array.prototype.slice.call(svg.querySelectorAll('[data-x]')):[];
    scaled.forEach(function(el){el._x=parseFloat(el.getAttribute('data-x'));
      el._w=parseFloat(el.getAttribute('data-w')||'0');});
    var zoom=1,label=document.getElementById('tl-zoom');
    function apply(){
      svg.setAttribute('width',String(base*zoom));
      scaled.forEach(function(el){
        if(el.tagName==='line'){
          el.setAttribute('x1',el._x*zoom);el.setAttribute('x2',(el._x+el._w)*zoom);
        }else{
          el.setAttribute('x',el._x*zoom);
          if(el.tagName!=='text')el.setAttribute('width',Math.max(1,el._w*zoom));
        }
      });
      if(label)label.textContent=zoom+'\\u00d7';
    }
    root.parentNode.querySelectorAll('[data-zoom]').forEach(function(b){
      b.addEventListener('click',function(){var z=b.getAttribute('data-zoom');
        zoom=z==='in'?Math.min(zoom*2,64):z==='out'?Math.max(zoom/2,1):1;apply();});
    });
    var m=/zoom=(\\d+)/.exec(location.hash);  // e.g. report.html#zoom=4: a shareable zoom
    if(m&&svg){zoom=Math.min(64,Math.max(1,parseInt(m[1],10)));apply();}
    var lit=[];
    root.addEventListener('mouseover',function(e){
      var g=e.target.closest?e.target.closest('[data-lane]'):null;
      var i=g?g.getAttribute('data-lane'):null;
      lit.forEach(function(el){el.classList.remove('hl');});lit=[];
      if(i===null)return;
      lit=Array.prototype.slice.call(root.querySelectorAll('[data-lane="'+i+'"]'));
      lit.forEach(function(el){el.classList.add('hl');});
    });
  }
  document.documentElement.setAttribute('data-ready','1');
})();
"""
