#!/usr/bin/env python3
"""No file-level cycles: within each crate, the modules one file names through `crate::...`
(outside tests and comments) must not lead back to it. A crate's root and a child's use of its
parent are structure, not dependencies."""
import os,re,sys,itertools
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
crates=[d for d in os.listdir('.') if os.path.isfile(os.path.join(d,'Cargo.toml')) and os.path.isdir(os.path.join(d,'src'))]
def modname(path, src):
    rel=os.path.relpath(path, src)[:-3]
    parts=rel.split(os.sep)
    if parts[-1] in ('lib','main','mod'): parts=parts[:-1]
    return '::'.join(parts)
total=0
for c in sorted(crates):
    src=os.path.join(c,'src')
    files={}
    for root,_,fs in os.walk(src):
        for f in fs:
            if f.endswith('.rs') and 'bin' not in root.split(os.sep):
                p=os.path.join(root,f); files[modname(p,src)]=p
    mods=set(files)
    edges={m:set() for m in mods}
    for m,p in files.items():
        text=open(p).read()
        text=text.split('#[cfg(test)]')[0]
        # Comments (doc links among them) are not dependencies.
        text='\n'.join(l for l in text.split('\n') if not l.lstrip().startswith('//'))
        for ref in re.findall(r'crate::([a-z_][a-z0-9_]*(?:::[a-z_][a-z0-9_]*)*)', text):
            parts=ref.split('::')
            # longest module prefix
            for k in range(len(parts),0,-1):
                cand='::'.join(parts[:k])
                if cand in mods:
                    if cand!=m and not m.startswith(cand+'::') and not cand.startswith(m+'::') and cand!='':
                        edges[m].add(cand)
                    break
        # super:: references from child to parent are structural; skip
    # find cycles (pairs and longer) with Tarjan
    index={};low={};stack=[];on=set();res=[];i=[0]
    def strong(v):
        index[v]=low[v]=i[0];i[0]+=1;stack.append(v);on.add(v)
        for w in edges[v]:
            if w not in index: strong(w);low[v]=min(low[v],low[w])
            elif w in on: low[v]=min(low[v],index[w])
        if low[v]==index[v]:
            comp=[]
            while True:
                w=stack.pop();on.discard(w);comp.append(w)
                if w==v: break
            if len(comp)>1: res.append(comp)
    sys.setrecursionlimit(10000)
    for v in mods:
        if v not in index: strong(v)
    for comp in res:
        total+=1
        print(f'{c}: modules {sorted(comp)} use each other: ' + ', '.join(f'{m} -> {sorted(edges[m] & set(comp))}' for m in sorted(comp)), file=sys.stderr)
if total:
    print(f'{total} file-level cycle(s): a module that uses another must not be used by it (ARCHITECTURE.md)', file=sys.stderr)
    sys.exit(1)
print('== no file-level cycles')
