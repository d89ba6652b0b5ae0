set terminal pngcairo size 900,600 noenhanced
set output 'bench/results/checkpoint_memory.png'
set title 'Residual MLP (d=128, batch 64): measured peak activation vs depth N'
set xlabel 'layers N'
set ylabel 'peak activation (MiB)'
set logscale xy 2
set xtics (8, 16, 32, 64)
set xrange [7:72]
set key top left
set grid
set datafile missing '?'
plot 'bench/results/checkpoint_memory.dat' u 1:2 w lp lw 2 t 'none()', \
     '' u 1:3 w lp lw 2 t 'every(sqrt N)', \
     '' u 1:4 w lp lw 2 t 'every(2)', \
     '' u 1:5 w lp lw 2 t 'every(8)', \
     '' u 1:6 w lp lw 2 t 'selective{softmax,gelu,dropout}', \
     '' u 1:7 w lp lw 2 t 'budget(none/2)', \
     '' u 1:8 w lp dt 2 t 'PyTorch none', \
     '' u 1:9 w lp dt 2 t 'PyTorch every(sqrt N)'
set output 'bench/results/checkpoint_budget.png'
unset logscale
set xtics auto
set xrange [0:*]
set yrange [0.8:*]
set title 'Residual MLP N=64: step time vs activation budget (relative to none(); dots: every(k) at their peak)'
set xlabel 'budget (MiB)'
set ylabel 'step time / none() step time'
set key top right
set label "none()" at 18.438,1.0000 point pt 7 offset -1,-1 right font ',9'
set label "every(sqrt N=8)" at 2.907,1.2249 point pt 7 offset -1,-1 right font ',9'
set label "every(2)" at 1.969,1.1839 point pt 7 offset -1,-1 right font ',9'
plot 'bench/results/checkpoint_budget.dat' u 1:2 w lp lw 2 pt 7 t 'budget(b): measured (median of per-round ratios)', \
     '' u 1:2:5:6 w yerrorbars lc 1 pt 0 t 'quartiles of the per-round ratios', \
     '' u 1:3 w lp lw 2 dt 2 t 'predicted: none + replay time (per-op costs)'
set datafile missing '?'
set yrange [0.9:*]
set xrange [0:*]
unset label
set xlabel 'measured peak activation (MiB)'
set ylabel 'step time / the framework''s own none() step time'
set key top right
set output 'bench/results/checkpoint_frontier_mlp.png'
set title 'Residual MLP N=64: time-memory frontier, remat budget() vs every(k) vs PyTorch 2.15.0+cu132'
plot 'bench/results/checkpoint_frontier_mlp.dat' index 0 u 1:2 w lp lw 2 pt 7 t 'remat budget(b)', \
     '' index 1 u 1:2:3 w labels point pt 5 offset 1,0.5 left font ',8' t 'remat fixed policies', \
     '' index 2 u 1:2:3 w labels point pt 9 offset 1,-0.5 left font ',8' t 'PyTorch'
set output 'bench/results/checkpoint_frontier_gpt.png'
set title 'GPT-12: time-memory frontier, remat budget() vs every(k) vs PyTorch 2.15.0+cu132'
plot 'bench/results/checkpoint_frontier_gpt.dat' index 0 u 1:2 w lp lw 2 pt 7 t 'remat budget(b)', \
     '' index 1 u 1:2:3 w labels point pt 5 offset 1,0.5 left font ',8' t 'remat fixed policies', \
     '' index 2 u 1:2:3 w labels point pt 9 offset 1,-0.5 left font ',8' t 'PyTorch'
